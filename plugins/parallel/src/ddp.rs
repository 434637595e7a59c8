//! [`DdpReducer`]: Megatron's `DistributedDataParallel` gradient reduction (SPEC §5.6) for
//! one rank. Gradients are packed into per-bucket flat buffers (fp32; bf16 for bf16 gradients),
//! pre-scaled by `1/(dp*cp)` and SUM all-reduced over the DP×CP group, one collective per bucket.
//!
//! With `overlap_grad_reduce` a bucket is handed to a communication thread as soon as all of
//! its parameters were reported final ([`GradSync::grads_ready`], called from the last
//! microbatch's backward), so its all-reduce runs while backward continues on the main
//! thread; [`GradSync::finish`] launches the rest and waits. Without overlap everything is
//! reduced in `finish`. Packing, scaling and the (rank-order) sum are the same either way,
//! so both give bitwise the same gradients.
//!
//! For the distributed optimizer (SPEC §5.7, [`DdpOptions::shard_for_distributed_optimizer`])
//! each bucket is padded to a multiple of the DP×CP size and **reduce-scattered**: DP rank `d`
//! ends up with the fully reduced range `[d·B/dp, (d+1)·B/dp)` of every bucket, written back
//! into the parameters' gradients with zeros everywhere else (so a norm over all local grads,
//! summed over DP, is the global norm). [`DdpReducer::shard_layout`] tells the optimizer which
//! ranges it owns. Parameters named in `separate_buckets` (the tied word embedding with
//! pp > 1) get a bucket of their own, so the first and last stage own the same rows of it and
//! the embedding-group all-reduce of the shards stays correct (Megatron's rule).
//!
//! Bucket dtype: a bucket whose gradients are all bf16 (`--grad-reduce-in-bf16`, SPEC §6.7) is
//! pre-scaled and reduced (all-reduce or reduce-scatter) **in bf16**, as Megatron's bf16 gradient
//! buffer: half the bytes on the wire; the communicator sums half inputs in fp32 in rank order
//! and rounds once, for both collectives, so a reduce-scatter gives bitwise the same range as
//! the all-reduce. Any other bucket (fp32 gradients, or a mix) is reduced in fp32.

use crate::buckets::{default_bucket_size, layout_buckets_separate, Bucket};
use crate::strategy::dp_cp_group;
use anyhow::{anyhow, bail, Context, Result};
use megatron_core::{
    copy_any, Backend, Communicator, DType, DeviceTensor, GradSync, Group, HostBuffer, ParallelContext, Param, ReduceOp,
};
use std::collections::{HashMap, HashSet};
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
    /// Reduce-scatter instead of all-reduce (`--use-distributed-optimizer`).
    pub shard_for_distributed_optimizer: bool,
}

/// One bucket as the distributed optimizer sees it: `(name, offset, numel)` of its
/// parameters in the flat buffer, padded to `padded_numel` (a multiple of the DP×CP size).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardBucket {
    pub params: Vec<(String, usize, usize)>,
    pub padded_numel: usize,
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
    jobs: Option<Sender<(usize, DeviceTensor, Option<DeviceTensor>)>>,
    done: Receiver<(usize, Result<DeviceTensor>)>,
    handle: Option<JoinHandle<()>>,
}

impl CommThread {
    fn start(comm: Arc<dyn Communicator>, group: Group) -> Result<CommThread> {
        let (jobs, rx) = channel::<(usize, DeviceTensor, Option<DeviceTensor>)>();
        let (tx, done) = channel();
        let handle = std::thread::Builder::new()
            .name(format!("ddp-comm-rank{}", comm.rank()))
            .spawn(move || {
                for (bucket, mut t, shard) in rx {
                    let r = match shard {
                        // Distributed optimizer: only this rank's reduced range comes back.
                        Some(mut out) => comm.reduce_scatter(&group, &t, &mut out, ReduceOp::Sum).map(|()| out),
                        None => comm.all_reduce(&group, &mut t, ReduceOp::Sum).map(|()| t),
                    };
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
    /// The dtype each bucket is reduced in (bf16 when all its gradients are bf16, else fp32).
    dtypes: Vec<DType>,
    /// Parameter name -> (bucket, position in the bucket).
    slot: HashMap<String, (usize, usize)>,
    staging: Vec<Staging>,
    /// Reduced buckets of this step (overlap: as they come back from the thread).
    reduced: Vec<Option<DeviceTensor>>,
    thread: Option<CommThread>,
    in_flight: usize,
    shard: bool,
    /// Expert parameters (`ParamLayout::expert_parallel`): not bucketed; summed over
    /// `edp_group` after the same `1/(dp·cp)` pre-scale, in `finish` (SPEC §5.8).
    experts: HashSet<String>,
    edp_group: Group,
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
        DdpReducer::with_separate_buckets(params, options, &[], backend, ctx)
    }

    /// [`DdpReducer::new`] where the parameters named in `separate_buckets` get a bucket each.
    pub fn with_separate_buckets(
        params: &[&Param],
        options: DdpOptions,
        separate_buckets: &[String],
        backend: Arc<dyn Backend>,
        ctx: &ParallelContext,
    ) -> Result<DdpReducer> {
        let group = dp_cp_group(ctx);
        // With ep = etp = 1 the expert-data-parallel group is the DP×CP group: experts are
        // buckets' ordinary members (and the distributed optimizer shards them like the rest).
        let split = ctx.experts_sharded();
        let (experts, params): (Vec<&Param>, Vec<&Param>) =
            params.iter().partition(|p| split && p.layout.expert_parallel);
        // With the distributed optimizer the experts stay unsharded (it steps them with a plain
        // Adam): only the dense buckets are reduce-scattered.
        let params = params.as_slice();
        let bucket_size = match (options.overlap_grad_reduce, options.bucket_size) {
            (_, Some(0)) => bail!("--ddp-bucket-size must be > 0"),
            (true, size) => Some(size.unwrap_or_else(|| default_bucket_size(group.size()))),
            (false, size) => size,
        };
        let numels: Vec<usize> = params.iter().map(|p| p.grad.numel()).collect();
        let separate: Vec<bool> = params.iter().map(|p| separate_buckets.iter().any(|n| n == &p.name)).collect();
        let buckets = layout_buckets_separate(&numels, bucket_size, &separate);
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
        let dtypes = buckets
            .iter()
            .map(|b| {
                let all_bf16 = b.params.iter().all(|&i| params[i].grad.dtype() == DType::BF16);
                if all_bf16 && !b.params.is_empty() {
                    DType::BF16
                } else {
                    DType::F32
                }
            })
            .collect();
        let mut r = DdpReducer {
            dtypes,
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
            shard: options.shard_for_distributed_optimizer,
            experts: experts.iter().map(|p| p.name.clone()).collect(),
            edp_group: ctx.edp_group.clone(),
        };
        r.reset();
        Ok(r)
    }

    /// The bucket layout (parameter indices in registration order), for tests and logs.
    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    /// Elements of bucket `b`'s flat buffer: padded to a multiple of the group size when
    /// reduce-scattering, so every rank owns an equal range.
    fn padded(&self, b: usize) -> usize {
        let n = self.buckets[b].numel;
        if self.shard {
            n.div_ceil(self.group.size()) * self.group.size()
        } else {
            n
        }
    }

    /// The buckets by parameter name with their padded sizes (distributed optimizer): rank `d`
    /// of the DP×CP group owns `[d·P/dp, (d+1)·P/dp)` of each bucket of padded size `P`.
    pub fn shard_layout(&self) -> Vec<ShardBucket> {
        self.buckets
            .iter()
            .enumerate()
            .map(|(b, bucket)| ShardBucket {
                params: bucket
                    .params
                    .iter()
                    .zip(&bucket.offsets)
                    .zip(&bucket.sizes)
                    .map(|((&i, &off), &n)| (self.names[i].clone(), off, n))
                    .collect(),
                padded_numel: self.padded(b),
            })
            .collect()
    }

    /// This rank's index in the DP×CP group and the group (distributed optimizer).
    pub fn group(&self) -> &Group {
        &self.group
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
        // Staged in fp32: exact for bf16 gradients (a bf16 bucket is rounded back losslessly).
        let grad = match self.backend.to_host(&p.grad)? {
            HostBuffer::F32(v) => v,
            b @ (HostBuffer::BF16(_) | HostBuffer::F16(_)) => b.to_f32_vec(),
            other => bail!("data-parallel reduction needs float gradients, `{}` has {}", p.name, other.dtype()),
        };
        let bucket = &self.buckets[b];
        let off = bucket.offsets[k];
        if st.data.is_empty() {
            st.data = vec![
                0.0;
                if self.shard {
                    bucket.numel.div_ceil(self.group.size()) * self.group.size()
                } else {
                    bucket.numel
                }
            ];
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
        let dtype = self.dtypes[b];
        let wide = self.backend.from_host(HostBuffer::F32(data), &[n])?;
        let mut t = if dtype == DType::F32 {
            wide
        } else {
            // Exact: every staged value came from a bf16 gradient.
            let mut half = self.backend.zeros(&[n], dtype)?;
            self.backend.cast(&wide, &mut half)?;
            half
        };
        // Pre-scaling (rather than dividing the sum) is Megatron's default (SPEC §5.6); a bf16
        // bucket is scaled in bf16 (rounded once per element), as Megatron's bf16 buffer.
        self.backend.scale(&mut t, self.scale)?;
        let shard_out = if self.shard { Some(self.backend.zeros(&[n / self.group.size()], dtype)?) } else { None };
        match &self.thread {
            Some(th) => {
                let jobs = th.jobs.as_ref().ok_or_else(|| anyhow!("the data-parallel communication thread is gone"))?;
                jobs.send((b, t, shard_out)).map_err(|_| anyhow!("the data-parallel communication thread stopped"))?;
                self.in_flight += 1;
            }
            None => {
                if let Some(mut out) = shard_out {
                    self.comm.reduce_scatter(&self.group, &t, &mut out, ReduceOp::Sum).with_context(|| {
                        format!("reduce-scattering gradient bucket {b} over the data-parallel group")
                    })?;
                    t = out;
                } else if self.group.size() > 1 {
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
        if params.len() != self.names.len() + self.experts.len() {
            bail!(
                "finish got {} parameters, the reducer was built for {}",
                params.len(),
                self.names.len() + self.experts.len()
            );
        }
        for p in params.iter() {
            if self.experts.contains(&p.name) {
                continue;
            }
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
                h @ HostBuffer::BF16(_) if self.dtypes[b] == DType::BF16 => h.to_f32_vec(),
                other => bail!("reduced gradient bucket {b} came back as {}", other.dtype()),
            };
            // Sharded: `flat` is this rank's range of the padded bucket; the rest reads as 0.
            let (lo, hi) = if self.shard {
                let per = flat.len();
                let d = self.group.ranks.iter().position(|&r| r == self.comm.rank()).unwrap_or(0);
                (d * per, (d + 1) * per)
            } else {
                (0, flat.len())
            };
            for (k, &i) in bucket.params.iter().enumerate() {
                let p = &mut params[by_name[&self.names[i]]];
                let (off, n) = (bucket.offsets[k], p.grad.numel());
                let g: Vec<f32> =
                    (off..off + n).map(|j| if (lo..hi).contains(&j) { flat[j - lo] } else { 0.0 }).collect();
                let src = backend.from_host(HostBuffer::F32(g), p.grad.shape())?;
                // A bf16 gradient gets its bf16-reduced values back exactly (a mixed fp32 bucket
                // rounds them once here).
                copy_any(backend, &src, &mut p.grad)
                    .with_context(|| format!("writing back the gradient of {}", p.name))?;
            }
        }
        // After the buckets (and the overlap thread) are done: one collective at a time.
        self.reduce_experts(params, backend)
    }
}

impl DdpReducer {
    /// Expert gradients: `1/(dp·cp)` then SUM over the expert-data-parallel group, one
    /// collective per parameter in registration order (the same on every replica).
    fn reduce_experts(&self, params: &mut [&mut Param], backend: &dyn Backend) -> Result<()> {
        for p in params.iter_mut().filter(|p| self.experts.contains(&p.name)) {
            backend.scale(&mut p.grad, self.scale)?;
            if self.edp_group.size() > 1 {
                self.comm.all_reduce(&self.edp_group, &mut p.grad, ReduceOp::Sum).with_context(|| {
                    format!("all-reducing expert gradient `{}` over the expert-data-parallel group", p.name)
                })?;
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
            if self.experts.contains(&p.name) {
                continue;
            }
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
