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
//! Mixed precision (`--bf16`/`--fp16`): the distributed optimizer keeps the fp32 main
//! parameters of its shard itself and rounds them (once, to nearest even) to the parameter
//! dtype on the owning rank before the gather, so the gathered buckets hold the model's half
//! values and the pre-hooks copy them as they are (see [`crate::DistributedOptimizer`]).

use crate::dist_opt::ShardedBucket;
use anyhow::{anyhow, bail, Context, Result};
use megatron_core::{copy_any, Backend, Communicator, DeviceTensor, ForwardPreHook, Group, HostBuffer, Param};
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// `(bucket, this rank's updated range (padded/dp,), in the bucket's gather dtype)`.
type Job = (usize, HostBuffer);

/// See the module doc.
pub struct ParamGather {
    backend: Arc<dyn Backend>,
    buckets: Vec<ShardedBucket>,
    /// Parameter name -> (bucket, offset in the bucket, numel).
    slot: HashMap<String, (usize, usize, usize)>,
    jobs: Option<Sender<Job>>,
    done: Receiver<(usize, Result<HostBuffer>)>,
    handle: Option<JoinHandle<()>>,
    /// Gathered buckets with parameters still to write.
    arrived: Vec<Option<HostBuffer>>,
    /// Per bucket, parameters whose gathered value is not written into the model yet.
    unwritten: Vec<HashSet<String>>,
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
            in_flight: 0,
        })
    }

    /// Starts the all-gather of bucket `b` from this rank's updated range `local` (fp32, or
    /// already rounded to the bucket's half dtype); its parameters are pending until a hook
    /// call writes them.
    pub fn launch(&mut self, b: usize, local: HostBuffer) -> Result<()> {
        if !self.unwritten[b].is_empty() || self.arrived[b].is_some() {
            bail!("parameter bucket {b} is launched again before its previous all-gather was written");
        }
        let jobs = self.jobs.as_ref().ok_or_else(|| anyhow!("the parameter all-gather thread is gone"))?;
        jobs.send((b, local)).map_err(|_| anyhow!("the parameter all-gather thread stopped"))?;
        self.in_flight += 1;
        self.unwritten[b] = self.buckets[b].params.iter().map(|p| p.0.clone()).collect();
        Ok(())
    }

    /// Whether any model parameter still waits for its gathered value.
    pub fn pending(&self) -> bool {
        self.unwritten.iter().any(|u| !u.is_empty())
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

    /// Writes `p`'s gathered value if it is pending (waiting for its bucket), and frees the
    /// bucket once all its parameters are written. A value gathered in the parameter's dtype is
    /// copied as it is (the owner rounded it); fp32 values into a half parameter are rounded by
    /// the backend's cast.
    fn write(&mut self, p: &mut Param) -> Result<()> {
        let Some(&(b, off, n)) = self.slot.get(&p.name) else { return Ok(()) };
        if !self.unwritten[b].contains(&p.name) {
            return Ok(());
        }
        self.wait_for(b)?;
        let full = self.arrived[b].as_ref().ok_or_else(|| anyhow!("bucket {b} vanished"))?;
        let src = self.backend.from_host(slice(full, off..off + n)?, p.value.shape())?;
        // A bucket of mixed dtypes gathers fp32: rounded into a half parameter here.
        copy_any(self.backend.as_ref(), &src, &mut p.value)
            .with_context(|| format!("writing the updated `{}`", p.name))?;
        self.unwritten[b].remove(&p.name);
        if self.unwritten[b].is_empty() {
            self.arrived[b] = None; // every parameter of the bucket has its value: free it
        }
        Ok(())
    }
}

/// Elements `range` of a float buffer.
pub(crate) fn slice(buf: &HostBuffer, range: Range<usize>) -> Result<HostBuffer> {
    Ok(match buf {
        HostBuffer::F32(v) => HostBuffer::F32(v[range].to_vec()),
        HostBuffer::BF16(v) => HostBuffer::BF16(v[range].to_vec()),
        HostBuffer::F16(v) => HostBuffer::F16(v[range].to_vec()),
        other => bail!("gathered parameters must be floats, got {}", other.dtype()),
    })
}

/// One all-gather of a bucket's `(padded/dp,)` ranges into the `(padded,)` bucket, in the
/// dtype of `local`.
fn gather(comm: &dyn Communicator, group: &Group, padded: usize, local: HostBuffer) -> Result<HostBuffer> {
    let (n, dtype) = (local.len(), local.dtype());
    let input = DeviceTensor::from_host_buffer(local, &[n])?;
    let mut out = DeviceTensor::from_host_buffer(HostBuffer::zeros(dtype, padded), &[padded])?;
    comm.all_gather(group, &input, &mut out)?;
    Ok(out.host_buffer()?.clone())
}

impl ForwardPreHook for ParamGather {
    fn before_forward(&mut self, params: &mut [&mut Param]) -> Result<()> {
        if !self.pending() {
            return Ok(());
        }
        params.iter_mut().try_for_each(|p| self.write(p))
    }

    fn finish(&mut self, params: &mut [&mut Param]) -> Result<()> {
        params.iter_mut().try_for_each(|p| self.write(p))?;
        if let Some(name) = self.unwritten.iter().flatten().next() {
            bail!("the gathered value of `{name}` has no parameter to go to (--overlap-param-gather)");
        }
        Ok(())
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
