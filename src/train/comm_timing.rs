//! `--timing-log-level 1`: where a multi-rank run's time goes. [`TimedCommunicator`] wraps a
//! rank's communicator and adds up the wall time spent inside each kind of call per group;
//! everything else a rank does during training is compute (its own kernels and host work).
//!
//! How to read the breakdown (printed per rank when training ends):
//! - `recv pp`: a later pipeline stage waiting for its input activation or an earlier one
//!   waiting for its output gradient. With the buffered `local` communicator the copy itself is
//!   a memcpy, so this is the pipeline bubble (plus imbalance between stages).
//! - collectives on `tp`/`dp`/`embedding`/`world`: the reduction itself plus the time this rank
//!   waited for the slowest peer of the group (load imbalance shows up here, not as compute).
//! - `compute` = training wall time − all of the above.

use anyhow::Result;
use megatron_core::{Communicator, DeviceTensor, Group, ReduceOp};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Time and calls per `(call, group name)`.
#[derive(Default)]
struct Totals {
    by_call: BTreeMap<(String, String), (f64, u64)>,
}

/// A communicator that times every call of the one it wraps.
pub struct TimedCommunicator {
    inner: Arc<dyn Communicator>,
    totals: Mutex<Totals>,
}

impl TimedCommunicator {
    pub fn new(inner: Arc<dyn Communicator>) -> TimedCommunicator {
        TimedCommunicator { inner, totals: Mutex::new(Totals::default()) }
    }

    fn timed<T>(&self, call: &str, group: &Group, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let start = Instant::now();
        let out = f();
        let secs = start.elapsed().as_secs_f64();
        let mut totals = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        let slot = totals.by_call.entry((call.to_string(), group.name.clone())).or_default();
        slot.0 += secs;
        slot.1 += 1;
        out
    }

    /// The per-rank breakdown of `train_secs` of training wall time, one line per call kind.
    pub fn report(&self, train_secs: f64, iterations: u64) -> String {
        let totals = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        let comm: f64 = totals.by_call.values().map(|v| v.0).sum();
        let per_iter = |s: f64| s / iterations.max(1) as f64;
        let pct = |s: f64| 100.0 * s / train_secs.max(1e-12);
        let mut out = format!(
            "rank {}: {:.3} s/iteration over {iterations} iterations; compute {:.3} s ({:.1}%), communication and \
             waiting {:.3} s ({:.1}%)",
            self.inner.rank(),
            per_iter(train_secs),
            per_iter(train_secs - comm),
            pct(train_secs - comm),
            per_iter(comm),
            pct(comm)
        );
        for ((call, group), (secs, calls)) in &totals.by_call {
            out.push_str(&format!(
                "\n    {call:<15} {group:<10} {:>8.4} s/iteration ({:>5.1}%), {calls} calls",
                per_iter(*secs),
                pct(*secs)
            ));
        }
        out
    }
}

impl Communicator for TimedCommunicator {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn all_reduce(&self, group: &Group, t: &mut DeviceTensor, op: ReduceOp) -> Result<()> {
        self.timed("all_reduce", group, || self.inner.all_reduce(group, t, op))
    }
    fn all_reduce_f64(&self, group: &Group, values: &mut [f64], op: ReduceOp) -> Result<()> {
        self.timed("all_reduce_f64", group, || self.inner.all_reduce_f64(group, values, op))
    }
    fn all_gather(&self, group: &Group, input: &DeviceTensor, output: &mut DeviceTensor) -> Result<()> {
        self.timed("all_gather", group, || self.inner.all_gather(group, input, output))
    }
    fn reduce_scatter(
        &self,
        group: &Group,
        input: &DeviceTensor,
        output: &mut DeviceTensor,
        op: ReduceOp,
    ) -> Result<()> {
        self.timed("reduce_scatter", group, || self.inner.reduce_scatter(group, input, output, op))
    }
    fn broadcast(&self, group: &Group, t: &mut DeviceTensor, root: usize) -> Result<()> {
        self.timed("broadcast", group, || self.inner.broadcast(group, t, root))
    }
    fn send(&self, group: &Group, t: &DeviceTensor, dst: usize) -> Result<()> {
        self.timed("send", group, || self.inner.send(group, t, dst))
    }
    fn recv(&self, group: &Group, t: &mut DeviceTensor, src: usize) -> Result<()> {
        self.timed("recv", group, || self.inner.recv(group, t, src))
    }
    fn barrier(&self, group: &Group) -> Result<()> {
        self.timed("barrier", group, || self.inner.barrier(group))
    }
    fn abort(&self, reason: &str) {
        self.inner.abort(reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use megatron_core::SingleRankCommunicator;

    #[test]
    fn counts_every_call_by_kind_and_group() {
        let timed = TimedCommunicator::new(Arc::new(SingleRankCommunicator));
        let g = Group::new("tp", vec![0]);
        let mut v = [1.0f64];
        for _ in 0..3 {
            timed.all_reduce_f64(&g, &mut v, ReduceOp::Sum).unwrap();
        }
        timed.barrier(&Group::new("dp", vec![0])).unwrap();
        let report = timed.report(1.0, 2);
        assert!(report.contains("all_reduce_f64  tp"), "{report}");
        assert!(report.contains("3 calls") && report.contains("1 calls"), "{report}");
        assert!(report.contains("over 2 iterations"), "{report}");
    }
}
