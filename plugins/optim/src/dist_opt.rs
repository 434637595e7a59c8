//! The distributed optimizer (`--use-distributed-optimizer`, ZeRO-1, SPEC §5.7) around Adam.
//!
//! The gradient buckets of the data-parallel reducer are reduce-scattered over the DP×CP
//! group (see `megatron_parallel::DdpReducer` in sharded mode): DP rank `d` holds the reduced
//! range `[d·P/dp, (d+1)·P/dp)` of every bucket of padded size `P`. This optimizer keeps the
//! fp32 main parameters and the Adam moments **only for that range**, as one segment per
//! parameter overlapping it, steps them with the backend's fused Adam, and all-gathers the
//! updated range of every bucket back into the full parameters. With
//! [`DistributedOptimizer::overlap_param_gather`] (`--overlap-param-gather`) the step only
//! starts those all-gathers and the next forward's pre-hooks write the parameters
//! ([`crate::ParamGather`]).
//!
//! Checkpoints stay layout-independent: [`Optimizer::state`] all-gathers the moments and
//! returns them per parameter under Adam's names (`{param}.exp_avg`, `{param}.exp_avg_sq`),
//! so a state saved here loads into plain Adam at any DP size and back (it is a collective:
//! every rank of the DP×CP group must call it, as checkpoint saving does).
//!
//! Parameters outside the buckets — sharded MoE experts (`ParamLayout::expert_parallel` with
//! ep · etp > 1), whose gradients the reducer all-reduces over their own expert-data-parallel
//! group instead — are stepped by a plain [`Adam`] inside this optimizer (full moments on every
//! replica), and their state is saved and loaded with the rest under the same names.
//!
//! Only the shard's state exists: with `dp` ranks the optimizer holds `2·N/dp` fp32 moments
//! instead of Adam's `2·N` (fp32 parameters are their own main parameters). With
//! `--bf16`/`--fp16` the [`crate::MixedPrecisionOptimizer`] around this one keeps an fp32 main
//! copy of every parameter, not only of the shard (`4·N` bytes per rank where Megatron keeps
//! `4·N/dp`): the moments are sharded, the main copies are not yet.

use crate::adam::{Adam, AdamConfig};
use crate::param_gather::ParamGather;
use crate::state_tensors::{self, clone_tensor};
use anyhow::{anyhow, bail, Context, Result};
use megatron_core::{
    AdamStep, Backend, Communicator, DType, DeviceTensor, Group, HostBuffer, Optimizer, OptimizerState, Param,
    SharedForwardPreHook,
};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

const KINDS: [&str; 2] = ["exp_avg", "exp_avg_sq"];

/// One gradient bucket: `(param name, offset in the flat buffer, numel)` and the padded size
/// (a multiple of the group size), exactly as the reducer laid it out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardedBucket {
    pub params: Vec<(String, usize, usize)>,
    pub padded_numel: usize,
}

/// The part of one parameter inside this rank's range of its bucket.
struct Segment {
    name: String,
    /// Element range inside the parameter.
    start: usize,
    len: usize,
    /// Offset inside this rank's range of the bucket.
    shard_offset: usize,
    /// Adam's moments of the segment, created on the first step. fp32 parameters are their
    /// own main parameters (as Megatron: no separate fp32 copy), so nothing else is kept.
    state: Option<[DeviceTensor; 2]>,
}

/// ZeRO-1 Adam (see the module doc).
pub struct DistributedOptimizer {
    config: AdamConfig,
    steps: u64,
    comm: Arc<dyn Communicator>,
    group: Group,
    buckets: Vec<ShardedBucket>,
    /// Per bucket, the segments of this rank's range.
    segments: Vec<Vec<Segment>>,
    /// Parameter shapes (for per-parameter checkpoint tensors).
    shapes: HashMap<String, Vec<usize>>,
    /// Parameters in no bucket (sharded experts) and the plain Adam that steps them.
    unsharded: HashSet<String>,
    plain: Adam,
    /// `--overlap-param-gather`: the step only starts the all-gathers (see [`ParamGather`]).
    overlap: Option<Arc<Mutex<ParamGather>>>,
}

impl DistributedOptimizer {
    /// `buckets` from the reducer's shard layout; `group` its DP×CP group; `params` the model's
    /// parameters (for their shapes).
    pub fn new(
        config: AdamConfig,
        buckets: Vec<ShardedBucket>,
        comm: Arc<dyn Communicator>,
        group: Group,
        params: &[&Param],
    ) -> Result<DistributedOptimizer> {
        crate::adam::Adam::new(config)?; // the same flag checks
        let n = group.size();
        let rank_in_group = group
            .ranks
            .iter()
            .position(|&r| r == comm.rank())
            .ok_or_else(|| anyhow!("rank {} is not in the data-parallel group {:?}", comm.rank(), group.ranks))?;
        let shapes: HashMap<String, Vec<usize>> =
            params.iter().map(|p| (p.name.clone(), p.value.shape().to_vec())).collect();
        let mut segments = Vec::with_capacity(buckets.len());
        for b in &buckets {
            if b.padded_numel % n != 0 {
                bail!("gradient bucket of {} elements does not split over {n} data-parallel ranks", b.padded_numel);
            }
            let per = b.padded_numel / n;
            let (lo, hi) = (rank_in_group * per, (rank_in_group + 1) * per);
            let mut segs = Vec::new();
            for (name, off, numel) in &b.params {
                if !shapes.contains_key(name) {
                    bail!("gradient bucket names parameter `{name}` that the model does not have");
                }
                let (s, e) = ((*off).max(lo), (off + numel).min(hi));
                if s < e {
                    segs.push(Segment {
                        name: name.clone(),
                        start: s - off,
                        len: e - s,
                        shard_offset: s - lo,
                        state: None,
                    });
                }
            }
            segments.push(segs);
        }
        let bucketed: HashSet<&str> = buckets.iter().flat_map(|b| b.params.iter().map(|p| p.0.as_str())).collect();
        let unsharded = params.iter().map(|p| p.name.clone()).filter(|n| !bucketed.contains(n.as_str())).collect();
        let plain = Adam::new(config)?;
        Ok(DistributedOptimizer {
            config,
            steps: 0,
            comm,
            group,
            buckets,
            segments,
            shapes,
            unsharded,
            plain,
            overlap: None,
        })
    }

    /// `--overlap-param-gather`: from now on [`Optimizer::step`] only starts the per-bucket
    /// all-gathers; the returned hook (install it in the model, see
    /// [`megatron_core::Model::set_forward_pre_hook`]) waits for them and writes the parameters.
    pub fn overlap_param_gather(&mut self, backend: Arc<dyn Backend>) -> Result<SharedForwardPreHook> {
        let g = ParamGather::new(self.buckets.clone(), self.comm.clone(), &self.group, backend)?;
        let g = Arc::new(Mutex::new(g));
        self.overlap = Some(g.clone());
        Ok(g)
    }

    /// The overlapped all-gather, once [`Self::overlap_param_gather`] started it: the
    /// mixed-precision optimizer around this one writes its main copies through it.
    pub fn param_gather(&self) -> Option<Arc<Mutex<ParamGather>>> {
        self.overlap.clone()
    }

    fn lock_overlap(&self) -> Result<Option<MutexGuard<'_, ParamGather>>> {
        match &self.overlap {
            None => Ok(None),
            Some(g) => Ok(Some(g.lock().map_err(|_| anyhow!("the parameter all-gather state was poisoned"))?)),
        }
    }

    /// fp32 values this rank's optimizer holds (the moments of its shard).
    pub fn state_numel(&self) -> usize {
        self.segments.iter().flatten().map(|s| 2 * s.len).sum()
    }

    fn per(&self, b: usize) -> usize {
        self.buckets[b].padded_numel / self.group.size()
    }

    /// All-gathers this rank's `(per)` range of bucket `b` into the full padded bucket.
    fn gather(&self, b: usize, local: Vec<f32>, backend: &dyn Backend) -> Result<Vec<f32>> {
        let input = backend.from_host(HostBuffer::F32(local), &[self.per(b)])?;
        let mut out = backend.zeros(&[self.buckets[b].padded_numel], DType::F32)?;
        self.comm.all_gather(&self.group, &input, &mut out).with_context(|| {
            format!("all-gathering bucket {b} over the data-parallel group (distributed optimizer)")
        })?;
        Ok(backend.to_host(&out)?.to_f32_vec())
    }
}

fn host(backend: &dyn Backend, t: &DeviceTensor, what: &str) -> Result<Vec<f32>> {
    match backend.to_host(t)? {
        HostBuffer::F32(v) => Ok(v),
        other => bail!("the distributed optimizer needs fp32 {what}, got {}", other.dtype()),
    }
}

impl Optimizer for DistributedOptimizer {
    fn name(&self) -> &str {
        "adam"
    }

    /// Expects the gradients reduce-scattered (valid on this rank's ranges) and clipped.
    fn step(&mut self, params: &mut [&mut Param], lr: f64, weight_decay: f64, backend: &dyn Backend) -> Result<()> {
        // Overlap: the previous step's gathers must have landed before the main params are read.
        // (With mixed precision `params` are the fp32 main copies.)
        if let Some(mut g) = self.lock_overlap()? {
            g.finish_main(params)?;
        }
        self.steps += 1;
        let index: HashMap<String, usize> = params.iter().enumerate().map(|(i, p)| (p.name.clone(), i)).collect();
        let find = |name: &str| {
            index.get(name).copied().ok_or_else(|| anyhow!("the distributed optimizer has no parameter `{name}` now"))
        };
        // Forward order (the reducer's buckets are in backward order): with overlap the first
        // layers' gathers start first. Buckets are independent, so the order changes no bits.
        for b in (0..self.buckets.len()).rev() {
            let per = self.per(b);
            let mut local = vec![0f32; per];
            for seg in &mut self.segments[b] {
                let p = &*params[find(&seg.name)?];
                let range = seg.start..seg.start + seg.len;
                let g = host(backend, &p.grad, "gradients")?;
                let g = backend.from_host(HostBuffer::F32(g[range.clone()].to_vec()), &[seg.len])?;
                let value = host(backend, &p.value, "parameters")?;
                let mut main = backend.from_host(HostBuffer::F32(value[range].to_vec()), &[seg.len])?;
                drop(value);
                if seg.state.is_none() {
                    let zeros = || backend.zeros(&[seg.len], DType::F32);
                    seg.state = Some([zeros()?, zeros()?]);
                }
                let [m, v] = seg.state.as_mut().ok_or_else(|| anyhow!("segment state missing"))?;
                let spec = AdamStep {
                    lr: lr as f32,
                    beta1: self.config.beta1 as f32,
                    beta2: self.config.beta2 as f32,
                    eps: self.config.eps as f32,
                    weight_decay: state_tensors::decay_for(p, weight_decay) as f32,
                    step: self.steps,
                };
                backend.adam_step(&mut main, &g, m, v, spec)?;
                local[seg.shard_offset..seg.shard_offset + seg.len].copy_from_slice(&host(backend, &main, "params")?);
            }
            if let Some(mut g) = self.lock_overlap()? {
                g.launch(b, local)?; // written by the next forward's pre-hooks
                continue;
            }
            // Every rank's updated range back into the full parameters.
            let full = self.gather(b, local, backend)?;
            for (name, off, numel) in &self.buckets[b].params {
                let p = &mut *params[find(name)?];
                let src = backend.from_host(HostBuffer::F32(full[*off..off + numel].to_vec()), p.value.shape())?;
                backend.copy(&src, &mut p.value).with_context(|| format!("writing the updated `{name}`"))?;
            }
        }
        // Every step, so the plain Adam's step count (bias correction) stays this one's.
        let mut rest: Vec<&mut Param> =
            params.iter_mut().filter(|p| self.unsharded.contains(&p.name)).map(|p| &mut **p).collect();
        self.plain.step(&mut rest, lr, weight_decay, backend)
    }

    fn steps(&self) -> u64 {
        self.steps
    }

    /// Per-parameter moments, gathered over the group (a collective; see the module doc).
    fn state(&self, backend: &dyn Backend) -> Result<OptimizerState> {
        let mut tensors = Vec::new();
        // Never stepped: no state, as plain Adam (all ranks agree on `steps`).
        if self.steps > 0 {
            for b in 0..self.buckets.len() {
                for (k, kind) in KINDS.iter().enumerate() {
                    let mut local = vec![0f32; self.per(b)];
                    for seg in &self.segments[b] {
                        let st = seg.state.as_ref().ok_or_else(|| anyhow!("`{}` has no optimizer state", seg.name))?;
                        local[seg.shard_offset..seg.shard_offset + seg.len]
                            .copy_from_slice(&host(backend, &st[k], kind)?);
                    }
                    let full = self.gather(b, local, backend)?;
                    for (name, off, numel) in &self.buckets[b].params {
                        let t =
                            backend.from_host(HostBuffer::F32(full[*off..off + numel].to_vec()), &self.shapes[name])?;
                        tensors.push((format!("{name}.{kind}"), clone_tensor(backend, &t)?));
                    }
                }
            }
        }
        if self.steps > 0 {
            tensors.extend(self.plain.state(backend)?.tensors);
        }
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(OptimizerState { scalars: serde_json::json!({ "step": self.steps }), tensors })
    }

    /// Takes per-parameter moments (from this optimizer or plain Adam, any DP size) and keeps
    /// this rank's ranges.
    fn load_state(&mut self, state: OptimizerState, params: &[&Param], backend: &dyn Backend) -> Result<()> {
        let (steps, mut states) = state_tensors::load(state, &KINDS, "adam", params, backend)?;
        self.steps = steps;
        let plain =
            states.iter().filter(|(n, _)| self.unsharded.contains(*n)).map(|(n, _)| n.clone()).collect::<Vec<_>>();
        self.plain.restore(steps, plain.into_iter().filter_map(|n| states.remove_entry(&n)).collect());
        for seg in self.segments.iter_mut().flatten() {
            seg.state = match states.get(&seg.name) {
                None => None,
                Some(ts) => {
                    let range = seg.start..seg.start + seg.len;
                    let slice = |t: &DeviceTensor, what| -> Result<DeviceTensor> {
                        let v = host(backend, t, what)?;
                        backend.from_host(HostBuffer::F32(v[range.clone()].to_vec()), &[seg.len])
                    };
                    Some([slice(&ts[0], "exp_avg")?, slice(&ts[1], "exp_avg_sq")?])
                }
            };
        }
        Ok(())
    }
}
