//! `Communicator::all_to_all` with variable splits on the threads communicator: every pair of
//! 3 ranks exchanges a different number of rows (zero included); splits that disagree between
//! peers are an error naming the group; the single-rank communicator is the identity.

use megatron_comm_local::LocalCommunicator;
use megatron_core::{Communicator, DeviceTensor, Group, HostBuffer, SingleRankCommunicator};
use std::time::Duration;

fn rows(v: Vec<f32>, width: usize) -> DeviceTensor {
    let n = v.len() / width;
    DeviceTensor::from_host_buffer(HostBuffer::F32(v), &[n, width]).expect("tensor")
}

/// Rows rank `s` sends to rank `d`: `(s + 2d) % 3` of them, valued `100 s + 10 d + row`.
fn count(s: usize, d: usize) -> usize {
    (s + 2 * d) % 3
}

#[test]
fn variable_splits_reach_the_right_ranks() {
    let comms = LocalCommunicator::world(3, Duration::from_secs(10));
    let group = Group::new("ep", vec![0, 1, 2]);
    let width = 2;
    std::thread::scope(|s| {
        for (me, c) in comms.iter().enumerate() {
            let group = group.clone();
            s.spawn(move || {
                let send: Vec<usize> = (0..3).map(|d| count(me, d)).collect();
                let recv: Vec<usize> = (0..3).map(|src| count(src, me)).collect();
                let mut data = Vec::new();
                for (d, &n) in send.iter().enumerate() {
                    for r in 0..n {
                        let v = (100 * me + 10 * d + r) as f32;
                        data.extend([v, -v]);
                    }
                }
                let input = rows(data, width);
                let mut out = rows(vec![0.0; recv.iter().sum::<usize>() * width], width);
                c.all_to_all(&group, &input, &send, &mut out, &recv).expect("all_to_all");
                let mut want = Vec::new();
                for (src, &n) in recv.iter().enumerate() {
                    for r in 0..n {
                        let v = (100 * src + 10 * me + r) as f32;
                        want.extend([v, -v]);
                    }
                }
                assert_eq!(out.host_f32().expect("host"), &want[..], "rank {me}");
            });
        }
    });
}

#[test]
fn disagreeing_splits_are_an_error() {
    let comms = LocalCommunicator::world(2, Duration::from_secs(5));
    let group = Group::new("ep", vec![0, 1]);
    let errors: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(me, c)| {
                let group = group.clone();
                s.spawn(move || {
                    // Rank 1 expects 2 rows from rank 0, which sends only 1.
                    let (send, recv) = if me == 0 { (vec![1, 1], vec![1, 1]) } else { (vec![1, 1], vec![2, 1]) };
                    let input = rows(vec![1.0; 2], 1);
                    let mut out = rows(vec![0.0; recv.iter().sum()], 1);
                    c.all_to_all(&group, &input, &send, &mut out, &recv).err().map(|e| e.to_string())
                })
            })
            .collect();
        hs.into_iter().filter_map(|h| h.join().expect("thread")).collect()
    });
    assert!(errors.iter().any(|e| e.contains("all_to_all on group `ep`") && e.contains("recv splits")), "{errors:?}");
}

#[test]
fn single_rank_all_to_all_is_the_identity() {
    let c = SingleRankCommunicator;
    let input = rows(vec![1.0, 2.0, 3.0, 4.0], 2);
    let mut out = rows(vec![0.0; 4], 2);
    c.all_to_all(&Group::new("ep", vec![0]), &input, &[2], &mut out, &[2]).expect("identity");
    assert_eq!(out.host_f32().expect("host"), &[1.0, 2.0, 3.0, 4.0]);
}
