//! Every collective of the `local` communicator with rank-valued inputs and exact expected
//! results, on worlds of 1..=8 ranks, on subgroups, and from two threads of one rank on two
//! groups at once.

use megatron_comm_local::LocalCommunicator;
use megatron_core::{Communicator, DeviceTensor, Group, HostBuffer, ReduceOp, Result};
use std::sync::Arc;
use std::time::Duration;

fn f32s(v: Vec<f32>) -> DeviceTensor {
    let n = v.len();
    DeviceTensor::from_host_buffer(HostBuffer::F32(v), &[n]).unwrap()
}

fn host(t: &DeviceTensor) -> Vec<f32> {
    t.host_f32().unwrap().to_vec()
}

/// Runs `f(rank, comm)` on every rank of a new world of `n` threads; returns the results by rank.
fn on_world<T: Send>(n: usize, f: impl Fn(usize, &dyn Communicator) -> Result<T> + Sync) -> Vec<T> {
    let comms = LocalCommunicator::world(n, Duration::from_secs(20));
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = comms.iter().enumerate().map(|(r, c)| s.spawn(move || f(r, c.as_ref()))).collect();
        handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
    })
}

fn world_group(n: usize) -> Group {
    Group::new("world", (0..n).collect())
}

#[test]
fn all_reduce_sum_and_max_every_world_size() {
    for n in 1..=8 {
        let out = on_world(n, |r, c| {
            let g = world_group(n);
            let mut t = f32s(vec![r as f32, 1.0, 10.0 * r as f32 - 3.0]);
            c.all_reduce(&g, &mut t, ReduceOp::Sum)?;
            let mut m = f32s(vec![r as f32, -(r as f32)]);
            c.all_reduce(&g, &mut m, ReduceOp::Max)?;
            let mut v = [r as f64 * 0.5, 1.0];
            c.all_reduce_f64(&g, &mut v, ReduceOp::Sum)?;
            let mut w = [r as f64];
            c.all_reduce_f64(&g, &mut w, ReduceOp::Max)?;
            Ok((host(&t), host(&m), v, w))
        });
        let s = (n * (n - 1) / 2) as f32;
        for (t, m, v, w) in out {
            assert_eq!(t, vec![s, n as f32, 10.0 * s - 3.0 * n as f32], "world {n}");
            assert_eq!(m, vec![(n - 1) as f32, 0.0]);
            assert_eq!(v, [s as f64 * 0.5, n as f64]);
            assert_eq!(w, [(n - 1) as f64]);
        }
    }
}

#[test]
fn gather_scatter_broadcast_every_world_size() {
    for n in 1..=8 {
        let out = on_world(n, |r, c| {
            let g = world_group(n);
            // all_gather: rank r contributes [r, 100 + r] (shape (1, 2)), output (n, 2).
            let input = DeviceTensor::from_host_buffer(HostBuffer::F32(vec![r as f32, 100.0 + r as f32]), &[1, 2])?;
            let mut gathered = DeviceTensor::from_host_buffer(HostBuffer::F32(vec![0.0; 2 * n]), &[n, 2])?;
            c.all_gather(&g, &input, &mut gathered)?;
            // reduce_scatter: rank r contributes x[i] = r * i over 2n elements; rank r keeps [2r, 2r+2).
            let rs_in = f32s((0..2 * n).map(|i| (r * i) as f32).collect());
            let mut rs_out = f32s(vec![0.0; 2]);
            c.reduce_scatter(&g, &rs_in, &mut rs_out, ReduceOp::Sum)?;
            // broadcast from the last rank, of int32 and u8 data (checkpoint indices are bytes).
            let mut b = DeviceTensor::from_host_buffer(HostBuffer::I32(vec![r as i32; 3]), &[3])?;
            c.broadcast(&g, &mut b, n - 1)?;
            let bytes = DeviceTensor::from_host_buffer(HostBuffer::U8(vec![b'a' + r as u8]), &[1])?;
            let mut all = DeviceTensor::from_host_buffer(HostBuffer::U8(vec![0; n]), &[n])?;
            c.all_gather(&g, &bytes, &mut all)?;
            c.barrier(&g)?;
            Ok((r, host(&gathered), host(&rs_out), b.host_i32()?.to_vec(), all.host_buffer()?.clone()))
        });
        let tri = (n * (n - 1) / 2) as f32;
        for (r, gathered, rs, b, all) in out {
            let want: Vec<f32> = (0..n).flat_map(|q| [q as f32, 100.0 + q as f32]).collect();
            assert_eq!(gathered, want);
            assert_eq!(rs, vec![tri * (2 * r) as f32, tri * (2 * r + 1) as f32], "world {n} rank {r}");
            assert_eq!(b, vec![(n - 1) as i32; 3]);
            assert_eq!(all, HostBuffer::U8((0..n).map(|q| b'a' + q as u8).collect()));
        }
    }
}

#[test]
fn subgroups_and_point_to_point() {
    // World of 8 as tp=2 x dp=4: tp groups {2k, 2k+1}, dp groups {t, t+2, t+4, t+6}.
    let out = on_world(8, |r, c| {
        let tp = Group::new("tp", vec![r / 2 * 2, r / 2 * 2 + 1]);
        let dp = Group::new("dp", (0..4).map(|k| r % 2 + 2 * k).collect());
        let mut a = f32s(vec![r as f32]);
        c.all_reduce(&tp, &mut a, ReduceOp::Sum)?;
        let mut b = f32s(vec![r as f32]);
        c.all_reduce(&dp, &mut b, ReduceOp::Sum)?;
        // A ring over the dp group: send to the next member, receive from the previous one.
        // Sends are buffered, so sending first on every rank cannot deadlock.
        let pos = dp.index_of(r).unwrap();
        let next = dp.ranks[(pos + 1) % 4];
        let prev = dp.ranks[(pos + 3) % 4];
        for k in 0..3 {
            c.send(&dp, &f32s(vec![r as f32, k as f32]), next)?;
        }
        let mut got = Vec::new();
        for _ in 0..3 {
            let mut t = f32s(vec![0.0; 2]);
            c.recv(&dp, &mut t, prev)?;
            got.push(host(&t));
        }
        Ok((r, host(&a)[0], host(&b)[0], got, prev))
    });
    for (r, a, b, got, prev) in out {
        assert_eq!(a, (r / 2 * 4 + 1) as f32);
        assert_eq!(b, (4 * (r % 2) + 12) as f32);
        assert_eq!(got, (0..3).map(|k| vec![prev as f32, k as f32]).collect::<Vec<_>>(), "messages arrive in order");
    }
}

#[test]
fn two_threads_of_one_rank_on_two_groups_concurrently() {
    // Each rank runs "dp" all-reduces on a helper thread while its main thread runs "tp"
    // all-reduces: 4 ranks as tp=2 x dp=2. Per-group sequence numbers keep them apart.
    let comms: Vec<Arc<dyn Communicator>> = LocalCommunicator::world(4, Duration::from_secs(20));
    let results: Vec<(f32, f32)> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let c = c.clone();
                s.spawn(move || {
                    let tp = Group::new("tp", vec![r / 2 * 2, r / 2 * 2 + 1]);
                    let dp = Group::new("dp", vec![r % 2, r % 2 + 2]);
                    let helper = {
                        let c = c.clone();
                        std::thread::spawn(move || {
                            let mut acc = 0.0;
                            for i in 0..200 {
                                let mut t = f32s(vec![(r * i) as f32]);
                                c.all_reduce(&dp, &mut t, ReduceOp::Sum).unwrap();
                                acc += host(&t)[0];
                            }
                            acc
                        })
                    };
                    let mut acc = 0.0;
                    for i in 0..200 {
                        let mut t = f32s(vec![(r + i) as f32]);
                        c.all_reduce(&tp, &mut t, ReduceOp::Sum).unwrap();
                        acc += host(&t)[0];
                    }
                    (acc, helper.join().unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, (tp_acc, dp_acc)) in results.into_iter().enumerate() {
        let pair = (r / 2 * 2 + r / 2 * 2 + 1) as f32;
        let tp_want: f32 = (0..200).map(|i| pair + 2.0 * i as f32).sum();
        let dp_want: f32 = (0..200).map(|i| ((r % 2 + r % 2 + 2) * i) as f32).sum();
        assert_eq!((tp_acc, dp_acc), (tp_want, dp_want), "rank {r}");
    }
}

#[test]
fn reduction_is_bitwise_identical_on_every_rank() {
    // Values whose f32 sum depends on the order: every rank must still get the same bits.
    let out = on_world(5, |r, c| {
        let mut t =
            f32s((0..64).map(|i| ((r * 7919 + i * 104_729) % 1000) as f32 * 1.37e-3 + 1e4 * (r % 2) as f32).collect());
        c.all_reduce(&world_group(5), &mut t, ReduceOp::Sum)?;
        Ok(host(&t))
    });
    assert!(out.windows(2).all(|w| w[0].iter().zip(&w[1]).all(|(a, b)| a.to_bits() == b.to_bits())));
}
