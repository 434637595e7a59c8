//! [`DdpReducer`]: Megatron's `DistributedDataParallel` gradient reduction (SPEC §5.6) for
//! one rank. Gradients are packed into per-bucket flat fp32 buffers, pre-scaled by
//! `1/(dp*cp)` and SUM all-reduced over the DP×CP group, one collective per bucket.
//!
//! With `overlap_grad_reduce` a bucket is handed to a communication thread as soon as all of
//! its parameters were reported final ([`GradSync::grads_ready`], called from the last
//! microbatch's backward), so its all-reduce runs while backward continues on the main
//! thread; [`GradSync::finish`] launches the rest and waits. Without overlap everything is
//! reduced in `finish`. Packing, scaling and the (rank-order) sum are the same either way,
//! so both give bitwise the same gradients.

use crate::buckets::{default_bucket_size, layout_buckets, Bucket};
use crate::strategy::dp_cp_group;
use anyhow::{anyhow, bail, Context, Result};
use megatron_core::{
    Backend, Communicator, DeviceTensor, GradSync, Group, HostBuffer, ParallelContext, Param, ReduceOp,
};
use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// DDP options (`--ddp-bucket-size`, `--overlap-grad-reduce`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DdpOptions {
    /// Elements per bucket; `None`: Megatron's default `max(40M, 1M*dp*cp)` with overlap,
    /// one bucket without.
    pub bucket_size: Option<usize>,
    pub overlap_grad_reduce: bool,
}

/// A bucket being filled during a step.
struct Staging {
    /// Flat gradients `(numel,)`, allocated on the first reported parameter.
    data: Vec<f32>,
    ready: Vec<bool>,
    remaining: usize,
    launched: bool,
}

/// The background thread that runs bucket all-reduces in launch order.
struct CommThread {
    jobs: Option<Sender<(usize, DeviceTensor)>>,
    done: Receiver<(usize, Result<DeviceTensor>)>,
    handle: Option<JoinHandle<()>>,
}

impl CommThread {
    fn start(comm: Arc<dyn Communicator>, group: Group) -> Result<CommThread> {
        let (jobs, rx) = channel::<(usize, DeviceTensor)>();
        let (tx, done) = channel();
        let handle = std::thread::Builder::new()
            .name(format!("ddp-comm-rank{}", comm.rank()))
            .spawn(move || {
                for (bucket, mut t) in rx {
                    let r = comm.all_reduce(&group, &mut t, ReduceOp::Sum).map(|()| t);
                    if tx.send((bucket, r)).is_err() {
                        break;
                    }
                }
            })
            .context("cannot start the data-parallel communication thread (--overlap-grad-reduce)")?;
        Ok(CommThread { jobs: Some(jobs), done, handle: Some(handle) })
    }
}

impl Drop for CommThread {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The gradient reducer of one rank (see the module doc).
pub struct DdpReducer {
    group: Group,
    comm: Arc<dyn Communicator>,
    backend: Arc<dyn Backend>,
    scale: f32,
    names: Vec<String>,
    buckets: Vec<Bucket>,
    /// Parameter name -> (bucket, position in the bucket).
    slot: HashMap<String, (usize, usize)>,
    staging: Vec<Staging>,
    /// Reduced buckets of this step (overlap: as they come back from the thread).
    reduced: Vec<Option<DeviceTensor>>,
    thread: Option<CommThread>,
    in_flight: usize,
}

impl DdpReducer {
    /// Lays out the buckets of `params` (the model's parameters in registration order) for
    /// the DP×CP group of `ctx`.
    pub fn new(
        params: &[&Param],
        options: DdpOptions,
        backend: Arc<dyn Backend>,
        ctx: &ParallelContext,
    ) -> Result<DdpReducer> {
        let group = dp_cp_group(ctx);
        let bucket_size = match (options.overlap_grad_reduce, options.bucket_size) {
            (_, Some(0)) => bail!("--ddp-bucket-size must be > 0"),
            (true, size) => Some(size.unwrap_or_else(|| default_bucket_size(group.size()))),
            (false, size) => size,
        };
        let numels: Vec<usize> = params.iter().map(|p| p.grad.numel()).collect();
        let buckets = layout_buckets(&numels, bucket_size);
        let mut slot = HashMap::new();
        for (b, bucket) in buckets.iter().enumerate() {
            for (k, &i) in bucket.params.iter().enumerate() {
                if slot.insert(params[i].name.clone(), (b, k)).is_some() {
                    bail!("two parameters are named `{}`; gradient buckets need unique names", params[i].name);
                }
            }
        }
        let thread = if options.overlap_grad_reduce && group.size() > 1 {
            Some(CommThread::start(ctx.comm.clone(), group.clone())?)
        } else {
            None
        };
        let mut r = DdpReducer {
            scale: 1.0 / group.size() as f32,
            group,
            comm: ctx.comm.clone(),
            backend,
            names: params.iter().map(|p| p.name.clone()).collect(),
            staging: Vec::new(),
            reduced: Vec::new(),
            buckets,
            slot,
            thread,
            in_flight: 0,
        };
        r.reset();
        Ok(r)
    }

    /// The bucket layout (parameter indices in registration order), for tests and logs.
    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    fn reset(&mut self) {
        self.staging = self
            .buckets
            .iter()
            .map(|b| Staging {
                data: Vec::new(),
                ready: vec![false; b.params.len()],
                remaining: b.params.len(),
                launched: false,
            })
            .collect();
        self.reduced = self.buckets.iter().map(|_| None).collect();
        self.in_flight = 0;
    }

    /// Copies `p`'s gradient into its bucket; returns the bucket when it became complete.
    fn stage(&mut self, p: &Param) -> Result<Option<usize>> {
        let &(b, k) = self.slot.get(&p.name).ok_or_else(|| {
            anyhow!("gradient of `{}` reported ready, but the data-parallel reducer was built without it", p.name)
        })?;
        let st = &mut self.staging[b];
        if st.ready[k] {
            bail!(
                "gradient of `{}` reported ready twice in one step: grads_ready must only be called during the \
                 last microbatch's backward",
                p.name
            );
        }
        let grad = match self.backend.to_host(&p.grad)? {
            HostBuffer::F32(v) => v,
            other => bail!("data-parallel reduction needs fp32 main grads, `{}` has {}", p.name, other.dtype()),
        };
        let bucket = &self.buckets[b];
        let off = bucket.offsets[k];
        if st.data.is_empty() {
            st.data = vec![0.0; bucket.numel];
        }
        st.data[off..off + grad.len()].copy_from_slice(&grad);
        st.ready[k] = true;
        st.remaining -= 1;
        Ok((st.remaining == 0).then_some(b))
    }

    /// Pre-scales bucket `b` and starts (overlap) or runs its all-reduce.
    fn launch(&mut self, b: usize) -> Result<()> {
        let st = &mut self.staging[b];
        st.launched = true;
        let data = std::mem::take(&mut st.data);
        let n = data.len();
        let mut t = self.backend.from_host(HostBuffer::F32(data), &[n])?;
        // Pre-scaling (rather than dividing the sum) is Megatron's default (SPEC §5.6).
        self.backend.scale(&mut t, self.scale)?;
        match &self.thread {
            Some(th) => {
                let jobs = th.jobs.as_ref().ok_or_else(|| anyhow!("the data-parallel communication thread is gone"))?;
                jobs.send((b, t)).map_err(|_| anyhow!("the data-parallel communication thread stopped"))?;
                self.in_flight += 1;
            }
            None => {
                if self.group.size() > 1 {
                    self.comm
                        .all_reduce(&self.group, &mut t, ReduceOp::Sum)
                        .with_context(|| format!("all-reducing gradient bucket {b} over the data-parallel group"))?;
                }
                self.reduced[b] = Some(t);
            }
        }
        Ok(())
    }

    fn finish_inner(&mut self, params: &mut [&mut Param], backend: &dyn Backend) -> Result<()> {
        if params.len() != self.names.len() {
            bail!("finish got {} parameters, the reducer was built for {}", params.len(), self.names.len());
        }
        for p in params.iter() {
            let &(b, k) = self
                .slot
                .get(&p.name)
                .ok_or_else(|| anyhow!("parameter `{}` is unknown to the data-parallel reducer", p.name))?;
            if !self.staging[b].ready[k] {
                if let Some(done) = self.stage(p)? {
                    self.launch(done)?;
                }
            }
        }
        // Every bucket is complete now; any not launched yet (none, normally) goes in order.
        for b in 0..self.buckets.len() {
            if !self.staging[b].launched {
                self.launch(b)?;
            }
        }
        if let Some(th) = &self.thread {
            while self.in_flight > 0 {
                let (b, r) = th.done.recv().map_err(|_| anyhow!("the data-parallel communication thread stopped"))?;
                self.in_flight -= 1;
                self.reduced[b] = Some(r.with_context(|| format!("all-reducing gradient bucket {b} (overlapped)"))?);
            }
        }
        let by_name: HashMap<String, usize> = params.iter().enumerate().map(|(i, p)| (p.name.clone(), i)).collect();
        for (b, bucket) in self.buckets.iter().enumerate() {
            let t = self.reduced[b].take().ok_or_else(|| anyhow!("gradient bucket {b} was never reduced"))?;
            let flat = match backend.to_host(&t)? {
                HostBuffer::F32(v) => v,
                other => bail!("reduced gradient bucket {b} came back as {}", other.dtype()),
            };
            for (k, &i) in bucket.params.iter().enumerate() {
                let p = &mut params[by_name[&self.names[i]]];
                let (off, n) = (bucket.offsets[k], p.grad.numel());
                let src = backend.from_host(HostBuffer::F32(flat[off..off + n].to_vec()), p.grad.shape())?;
                backend.copy(&src, &mut p.grad).with_context(|| format!("writing back the gradient of {}", p.name))?;
            }
        }
        Ok(())
    }
}

impl GradSync for DdpReducer {
    fn grads_ready(&mut self, params: &[&Param]) -> Result<()> {
        if self.thread.is_none() {
            // Without overlap `finish` packs every gradient; nothing to start early.
            return Ok(());
        }
        for p in params {
            if let Some(b) = self.stage(p)? {
                self.launch(b)?;
            }
        }
        Ok(())
    }

    fn finish(&mut self, params: &mut [&mut Param], backend: &dyn Backend) -> Result<()> {
        let r = self.finish_inner(params, backend);
        if r.is_err() {
            // Drain what is still in flight so the next step starts clean (or fails again).
            if let Some(th) = &self.thread {
                while self.in_flight > 0 && th.done.recv().is_ok() {
                    self.in_flight -= 1;
                }
            }
        }
        self.reset();
        r
    }
}
