//! Failures of the `local` communicator are errors, never hangs: a rank that skips a
//! collective makes every rank fail with the group, the collective, its sequence number and
//! the missing ranks; mismatched collectives name both calls; `abort` releases every rank.

use megatron_comm_local::LocalCommunicator;
use megatron_core::{Communicator, DeviceTensor, Group, HostBuffer, ReduceOp, Result};
use std::time::Duration;

fn f32s(v: Vec<f32>) -> DeviceTensor {
    let n = v.len();
    DeviceTensor::from_host_buffer(HostBuffer::F32(v), &[n]).unwrap()
}

fn on_world(n: usize, timeout_ms: u64, f: impl Fn(usize, &dyn Communicator) -> Result<()> + Sync) -> Vec<String> {
    let comms = LocalCommunicator::world(n, Duration::from_millis(timeout_ms));
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = comms.iter().enumerate().map(|(r, c)| s.spawn(move || f(r, c.as_ref()))).collect();
        handles.into_iter().map(|h| h.join().unwrap().err().map(|e| format!("{e:#}")).unwrap_or_default()).collect()
    })
}

#[test]
fn a_skipped_collective_times_out_on_every_rank_naming_the_missing_rank() {
    let errors = on_world(3, 300, |r, c| {
        let g = Group::new("dp", vec![0, 1, 2]);
        let mut t = f32s(vec![1.0]);
        c.all_reduce(&g, &mut t, ReduceOp::Sum)?; // #0: everybody
        if r != 2 {
            c.all_reduce(&g, &mut t, ReduceOp::Sum)?; // #1: rank 2 skips it and finishes
        }
        Ok(())
    });
    println!("timeout diagnostic: {}", errors[0]);
    assert!(errors[2].is_empty());
    for (r, e) in errors.iter().take(2).enumerate() {
        assert!(e.contains("timed out after 300ms"), "rank {r}: {e}");
        assert!(e.contains("group `dp` [0, 1, 2]") && e.contains("all_reduce(sum, fp32 x 1) #1"), "rank {r}: {e}");
        assert!(e.contains("ranks [2] never arrived"), "rank {r}: {e}");
    }
}

#[test]
fn a_missing_peer_in_recv_times_out() {
    let errors = on_world(2, 200, |r, c| {
        let g = Group::new("pp", vec![0, 1]);
        if r == 1 {
            c.recv(&g, &mut f32s(vec![0.0; 4]), 0)?;
        }
        Ok(())
    });
    assert!(errors[0].is_empty());
    assert!(
        errors[1].contains("recv #0 from rank 0 on group `pp` [0, 1] timed out") && errors[1].contains("never sent")
    );
}

#[test]
fn mismatched_collectives_name_both_calls() {
    let errors = on_world(2, 5000, |r, c| {
        let g = Group::new("tp", vec![0, 1]);
        let mut t = f32s(vec![1.0; 4]);
        if r == 0 {
            c.all_reduce(&g, &mut t, ReduceOp::Sum)
        } else {
            let mut out = f32s(vec![0.0; 8]);
            // Give rank 0 time to arrive first so the message order is fixed.
            std::thread::sleep(Duration::from_millis(50));
            c.all_gather(&g, &t, &mut out)
        }
    });
    println!("mismatch diagnostic: {}", errors[1]);
    for e in &errors {
        assert!(e.contains("mismatched collectives on group `tp` [0, 1] at sequence #0"), "{e}");
        assert!(e.contains("rank 0 called all_reduce(sum, fp32 x 4) but rank 1 called all_gather(fp32 x 4)"), "{e}");
    }
    let errors = on_world(2, 5000, |r, c| {
        let mut t = f32s(vec![1.0; 3 + r]);
        c.all_reduce(&Group::new("dp", vec![0, 1]), &mut t, ReduceOp::Max)
    });
    assert!(
        errors.iter().all(|e| e.contains("mismatched") && e.contains("fp32 x 3") && e.contains("fp32 x 4")),
        "{errors:?}"
    );
}

#[test]
fn abort_releases_waiting_ranks_and_bad_groups_are_rejected() {
    let errors = on_world(3, 60_000, |r, c| {
        if r == 1 {
            std::thread::sleep(Duration::from_millis(50));
            c.abort("rank 1 hit an error");
            return Ok(());
        }
        c.barrier(&Group::new("world", vec![0, 1, 2]))
    });
    for r in [0, 2] {
        assert!(errors[r].contains("rank 1 aborted the world: rank 1 hit an error"), "{}", errors[r]);
    }
    let errors = on_world(2, 1000, |r, c| {
        let mut t = f32s(vec![0.0]);
        if r == 0 {
            c.all_reduce(&Group::new("x", vec![1]), &mut t, ReduceOp::Sum)?;
        }
        c.all_reduce(&Group::new("y", vec![0, 5]), &mut t, ReduceOp::Sum)
    });
    assert!(errors[0].contains("rank 0 is not a member of group `x` [1]"), "{}", errors[0]);
    assert!(errors[1].contains("names rank 5, but the world has 2 ranks"), "{}", errors[1]);
}
