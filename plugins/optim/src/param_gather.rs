//! [`ParamGather`]: the overlapped parameter all-gather of the distributed optimizer
//! (`--overlap-param-gather`, SPEC §5.7).
//!
//! [`crate::DistributedOptimizer::step`] hands each bucket's updated local range to
//! [`ParamGather::launch`], in forward order (the reducer's buckets are in backward order, so
//! the last bucket first). A communication thread all-gathers the buckets one after another on
//! a group of its own name (its own sequence numbers, so it never interleaves with the
//! collectives the main thread runs meanwhile, e.g. tensor-parallel ones in the forward). The
//! model's forward pre-hook ([`ForwardPreHook::before_forward`]) then waits only for the
//! bucket(s) of the module it is about to run and writes just that module's parameters.
//!
//! The gathered bytes and the order they are summed in are those of the synchronous path
//! (same local ranges, same all-gather), so results are bitwise the same with and without
//! overlap; only the time at which each parameter is written moves. Megatron dispatches the
//! next bucket's all-gather when one is waited for; here all of them are queued at the end of
//! the step and the thread runs them back to back, which keeps at most one in flight too.
//!
//! Mixed precision (`--bf16`/`--fp16`, [`crate::MixedPrecisionOptimizer`] around the
//! distributed optimizer): the gathered values are the fp32 main parameters, and each one has
//! two destinations — the model's half parameter (rounded to nearest even by the backend's
//! cast, as the synchronous path rounds the main copy) and the fp32 main copy in the
//! mixed-precision optimizer. [`ParamGather::set_mixed_precision`] keeps the two apart: the
//! pre-hooks write the model's parameters, the optimizer writes its main copies
//! ([`ParamGather::finish_main`]) before it next reads them, and a gathered bucket is freed once
//! both are written. A step that the loss scaler skips reads nothing, so the main copies simply
//! stay pending until the next applied step (or a checkpoint, which reads the pending values
//! through [`ParamGather::pending_main_value`]).

use crate::dist_opt::ShardedBucket;
use anyhow::{anyhow, bail, Context, Result};
use megatron_core::{Backend, Communicator, DType, DeviceTensor, ForwardPreHook, Group, HostBuffer, Param};
use std::collections::{HashMap, HashSet};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// `(bucket, this rank's updated range (padded/dp,))`.
type Job = (usize, Vec<f32>);

/// Where a gathered value goes: the model's parameter (pre-hooks) or, with mixed precision,
/// the optimizer's fp32 main copy (the same object as the model's parameter in fp32).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    Model,
    Main,
}

/// See the module doc.
pub struct ParamGather {
    backend: Arc<dyn Backend>,
    buckets: Vec<ShardedBucket>,
    /// Parameter name -> (bucket, offset in the bucket, numel).
    slot: HashMap<String, (usize, usize, usize)>,
    jobs: Option<Sender<Job>>,
    done: Receiver<(usize, Result<Vec<f32>>)>,
    handle: Option<JoinHandle<()>>,
    /// Gathered buckets with parameters still to write.
    arrived: Vec<Option<Vec<f32>>>,
    /// Per bucket, parameters whose gathered value is not written into the model yet.
    unwritten: Vec<HashSet<String>>,
    /// Mixed precision only: per bucket, main copies not written yet (see the module doc).
    unwritten_main: Vec<HashSet<String>>,
    mixed: bool,
    in_flight: usize,
}

impl ParamGather {
    /// Starts the thread that all-gathers over `group` (renamed, see the module doc).
    pub fn new(
        buckets: Vec<ShardedBucket>,
        comm: Arc<dyn Communicator>,
        group: &Group,
        backend: Arc<dyn Backend>,
    ) -> Result<ParamGather> {
        let mut slot = HashMap::new();
        for (b, bucket) in buckets.iter().enumerate() {
            for (name, off, n) in &bucket.params {
                slot.insert(name.clone(), (b, *off, *n));
            }
        }
        let gather_group = Group::new(format!("{}-param-gather", group.name), group.ranks.clone());
        let sizes: Vec<usize> = buckets.iter().map(|b| b.padded_numel).collect();
        let (jobs, rx) = channel::<Job>();
        let (tx, done) = channel();
        let handle = std::thread::Builder::new()
            .name(format!("param-gather-rank{}", comm.rank()))
            .spawn(move || {
                for (b, local) in rx {
                    let r = gather(comm.as_ref(), &gather_group, sizes[b], local)
                        .with_context(|| format!("all-gathering parameter bucket {b} (--overlap-param-gather)"));
                    if tx.send((b, r)).is_err() {
                        break;
                    }
                }
            })
            .context("cannot start the parameter all-gather thread (--overlap-param-gather)")?;
        let n = buckets.len();
        Ok(ParamGather {
            backend,
            buckets,
            slot,
            jobs: Some(jobs),
            done,
            handle: Some(handle),
            arrived: vec![None; n],
            unwritten: vec![HashSet::new(); n],
            unwritten_main: vec![HashSet::new(); n],
            mixed: false,
            in_flight: 0,
        })
    }

    /// The parameters the optimizer steps are fp32 main copies of half model parameters: every
    /// gathered value goes to both (see the module doc). Set before the first launch.
    pub fn set_mixed_precision(&mut self) -> Result<()> {
        if self.in_flight > 0 || self.pending() {
            bail!("--overlap-param-gather: mixed precision must be set before the first step");
        }
        self.mixed = true;
        Ok(())
    }

    /// Starts the all-gather of bucket `b` from this rank's updated range `local`; its
    /// parameters are pending until a hook call writes them.
    pub fn launch(&mut self, b: usize, local: Vec<f32>) -> Result<()> {
        if !self.unwritten[b].is_empty() || !self.unwritten_main[b].is_empty() || self.arrived[b].is_some() {
            bail!("parameter bucket {b} is launched again before its previous all-gather was written");
        }
        let jobs = self.jobs.as_ref().ok_or_else(|| anyhow!("the parameter all-gather thread is gone"))?;
        jobs.send((b, local)).map_err(|_| anyhow!("the parameter all-gather thread stopped"))?;
        self.in_flight += 1;
        self.unwritten[b] = self.buckets[b].params.iter().map(|p| p.0.clone()).collect();
        if self.mixed {
            self.unwritten_main[b] = self.unwritten[b].clone();
        }
        Ok(())
    }

    /// Whether any model parameter still waits for its gathered value.
    pub fn pending(&self) -> bool {
        self.unwritten.iter().any(|u| !u.is_empty())
    }

    /// Whether the model parameter `name` still waits for its gathered value (the
    /// mixed-precision optimizer does not round a stale main copy into it then).
    pub fn is_pending(&self, name: &str) -> bool {
        self.slot.get(name).is_some_and(|&(b, _, _)| self.unwritten[b].contains(name))
    }

    fn set(&mut self, target: Target) -> &mut Vec<HashSet<String>> {
        match target {
            Target::Main if self.mixed => &mut self.unwritten_main,
            _ => &mut self.unwritten,
        }
    }

    /// Receives finished gathers (in launch order) until bucket `b` is here.
    fn wait_for(&mut self, b: usize) -> Result<()> {
        while self.arrived[b].is_none() {
            if self.in_flight == 0 {
                bail!("parameter bucket {b} is pending but no all-gather is in flight");
            }
            let (got, r) = self.done.recv().map_err(|_| anyhow!("the parameter all-gather thread stopped"))?;
            self.in_flight -= 1;
            self.arrived[got] = Some(r?);
        }
        Ok(())
    }

    /// `name`'s gathered value if it is pending for `target` (waiting for its bucket); with
    /// `consume` it is marked written, and the bucket freed once nothing else waits for it.
    fn value(&mut self, name: &str, target: Target, consume: bool) -> Result<Option<Vec<f32>>> {
        let Some(&(b, off, n)) = self.slot.get(name) else { return Ok(None) };
        if !self.set(target)[b].contains(name) {
            return Ok(None);
        }
        self.wait_for(b)?;
        let full = self.arrived[b].as_ref().ok_or_else(|| anyhow!("bucket {b} vanished"))?;
        let v = full[off..off + n].to_vec();
        if consume {
            self.set(target)[b].remove(name);
            if self.unwritten[b].is_empty() && self.unwritten_main[b].is_empty() {
                self.arrived[b] = None; // every destination of the bucket has its value: free it
            }
        }
        Ok(Some(v))
    }

    /// Writes `p`'s gathered value if it is pending for `target`; a half parameter gets it
    /// rounded by the backend's cast (the synchronous path's rounding of the main copy).
    fn write(&mut self, p: &mut Param, target: Target) -> Result<()> {
        let Some(v) = self.value(&p.name, target, true)? else { return Ok(()) };
        let src = self.backend.from_host(HostBuffer::F32(v), p.value.shape())?;
        let r = if p.value.dtype() == DType::F32 {
            self.backend.copy(&src, &mut p.value)
        } else {
            self.backend.cast(&src, &mut p.value)
        };
        r.with_context(|| format!("writing the updated `{}`", p.name))
    }

    fn finish_target(&mut self, params: &mut [&mut Param], target: Target) -> Result<()> {
        params.iter_mut().try_for_each(|p| self.write(p, target))?;
        if let Some(name) = self.set(target).iter().flatten().next() {
            bail!("the gathered value of `{name}` has no parameter to go to (--overlap-param-gather)");
        }
        Ok(())
    }

    /// Writes every pending value into the optimizer's parameters `mains` (all of them): the
    /// fp32 main copies with mixed precision, the model's parameters otherwise (then the same
    /// as [`ForwardPreHook::finish`]).
    pub fn finish_main(&mut self, mains: &mut [&mut Param]) -> Result<()> {
        self.finish_target(mains, Target::Main)
    }

    /// The gathered value of main copy `name` if it is still pending (waiting for it; it stays
    /// pending): what a checkpoint must save instead of the stale copy.
    pub fn pending_main_value(&mut self, name: &str) -> Result<Option<Vec<f32>>> {
        self.value(name, Target::Main, false)
    }
}

/// One all-gather of a bucket's `(padded/dp,)` ranges into the `(padded,)` bucket.
fn gather(comm: &dyn Communicator, group: &Group, padded: usize, local: Vec<f32>) -> Result<Vec<f32>> {
    let n = local.len();
    let input = DeviceTensor::from_host_buffer(HostBuffer::F32(local), &[n])?;
    let mut out = DeviceTensor::from_host_buffer(HostBuffer::F32(vec![0.0; padded]), &[padded])?;
    comm.all_gather(group, &input, &mut out)?;
    match out.host_buffer()? {
        HostBuffer::F32(v) => Ok(v.clone()),
        other => bail!("the parameter all-gather returned {}", other.dtype()),
    }
}

impl ForwardPreHook for ParamGather {
    fn before_forward(&mut self, params: &mut [&mut Param]) -> Result<()> {
        if !self.pending() {
            return Ok(());
        }
        params.iter_mut().try_for_each(|p| self.write(p, Target::Model))
    }

    fn finish(&mut self, params: &mut [&mut Param]) -> Result<()> {
        self.finish_target(params, Target::Model)
    }
}

impl Drop for ParamGather {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
