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
//! instead of Adam's `2·N` (fp32 parameters are their own main parameters).
//!
//! Mixed precision (`--bf16`/`--fp16`, SPEC §5.7/§6.7; this optimizer is then not wrapped in a
//! [`crate::MixedPrecisionOptimizer`]): a half parameter's fp32 main values are kept **only for
//! the shard** too, one fp32 tensor per segment, made from the half values on the first step
//! (or loaded). The step takes the reduced gradients of the shard (fp32, or bf16 with
//! `--grad-reduce-in-bf16`, whose buckets the reducer reduce-scatters in bf16: widened exactly to
//! fp32 here), updates the main values in fp32, rounds them once (to
//! nearest even, the backend's cast) to the bucket's dtype on the owning rank, and all-gathers
//! the half values into the model: 2 bytes per element on the wire, as Megatron, and bitwise
//! what rounding a full main copy on every rank gives, since rounding is elementwise. Per rank
//! that is `4·N/dp` bytes of main parameters instead of `4·N` (SPEC §5.7's `6 + 12/dp` bytes per
//! parameter with bf16 parameters and fp32 gradients). Checkpoints hold the main values per
//! parameter (`"{param}.main_param"`, gathered like the moments), so they load into the
//! mixed-precision Adam at any layout and back.

use crate::adam::{Adam, AdamConfig};
use crate::mixed_precision::{take_main_params, MixedPrecisionOptimizer, MAIN_PARAM};
use crate::param_gather::{slice, ParamGather};
use crate::state_tensors::{self, clone_tensor};
use anyhow::{anyhow, bail, Context, Result};
use megatron_core::{
    copy_any, AdamStep, Backend, Communicator, DType, DeviceTensor, ForwardPreHook, Group, HostBuffer, Optimizer,
    OptimizerState, Param, SharedForwardPreHook,
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
    /// Adam's moments of the segment, created on the first step.
    state: Option<[DeviceTensor; 2]>,
    /// Half parameters only: the fp32 main values of the segment `(len,)`, made from the half
    /// values on the first step. fp32 parameters are their own main parameters (as Megatron:
    /// no separate fp32 copy), so nothing is kept for them.
    main: Option<DeviceTensor>,
}

/// The optimizer of the parameters outside the buckets: Adam, around half parameters inside a
/// [`MixedPrecisionOptimizer`] (their full fp32 main copies: replicas step them whole).
enum Plain {
    Fp32(Adam),
    Half(MixedPrecisionOptimizer),
}

impl Plain {
    fn get(&mut self) -> &mut dyn Optimizer {
        match self {
            Plain::Fp32(a) => a,
            Plain::Half(m) => m,
        }
    }

    fn get_ref(&self) -> &dyn Optimizer {
        match self {
            Plain::Fp32(a) => a,
            Plain::Half(m) => m,
        }
    }
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
    /// Parameters stored in a half dtype: the segments keep their fp32 main values.
    half: HashSet<String>,
    /// Per bucket, the dtype its updated values are all-gathered in: its parameters' dtype
    /// (the owner rounds), fp32 for a bucket that mixes dtypes.
    gather_dtypes: Vec<DType>,
    /// Parameters in no bucket (sharded experts) and the plain Adam that steps them.
    unsharded: HashSet<String>,
    plain: Plain,
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
                        main: None,
                    });
                }
            }
            segments.push(segs);
        }
        let bucketed: HashSet<&str> = buckets.iter().flat_map(|b| b.params.iter().map(|p| p.0.as_str())).collect();
        let unsharded: HashSet<String> =
            params.iter().map(|p| p.name.clone()).filter(|n| !bucketed.contains(n.as_str())).collect();
        let dtypes: HashMap<&str, DType> = params.iter().map(|p| (p.name.as_str(), p.value.dtype())).collect();
        let half: HashSet<String> =
            params.iter().filter(|p| p.value.dtype() != DType::F32).map(|p| p.name.clone()).collect();
        let gather_dtypes = buckets
            .iter()
            .map(|b| {
                let mut ds = b.params.iter().map(|p| dtypes[p.0.as_str()]);
                let first = ds.next().unwrap_or(DType::F32);
                if ds.all(|d| d == first) {
                    first
                } else {
                    DType::F32
                }
            })
            .collect();
        let plain = if unsharded.iter().any(|n| half.contains(n)) {
            Plain::Half(MixedPrecisionOptimizer::new(Box::new(Adam::new(config)?)))
        } else {
            Plain::Fp32(Adam::new(config)?)
        };
        Ok(DistributedOptimizer {
            config,
            steps: 0,
            comm,
            group,
            buckets,
            segments,
            shapes,
            half,
            gather_dtypes,
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

    /// The overlapped all-gather, once [`Self::overlap_param_gather`] started it.
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

    /// fp32 main values this rank holds for half parameters: those of its shard (after the
    /// first step or a load), plus the full copies of half parameters outside the buckets.
    pub fn main_numel(&self) -> usize {
        let sharded: usize = self.segments.iter().flatten().filter_map(|s| s.main.as_ref()).map(|m| m.numel()).sum();
        sharded
            + match &self.plain {
                Plain::Half(m) => m.main_numel(),
                Plain::Fp32(_) => 0,
            }
    }

    fn per(&self, b: usize) -> usize {
        self.buckets[b].padded_numel / self.group.size()
    }

    /// All-gathers this rank's `(per)` range of bucket `b` into the full padded bucket, in the
    /// dtype of `local`.
    fn gather(&self, b: usize, local: HostBuffer, backend: &dyn Backend) -> Result<HostBuffer> {
        let dtype = local.dtype();
        let input = backend.from_host(local, &[self.per(b)])?;
        let mut out = backend.zeros(&[self.buckets[b].padded_numel], dtype)?;
        self.comm.all_gather(&self.group, &input, &mut out).with_context(|| {
            format!("all-gathering bucket {b} over the data-parallel group (distributed optimizer)")
        })?;
        backend.to_host(&out)
    }

    /// This rank's updated fp32 range of bucket `b` in the bucket's gather dtype: rounded here,
    /// once, by the backend's cast (to nearest even), so every rank receives the same bits.
    fn round(&self, b: usize, local: Vec<f32>, backend: &dyn Backend) -> Result<HostBuffer> {
        let dtype = self.gather_dtypes[b];
        if dtype == DType::F32 {
            return Ok(HostBuffer::F32(local));
        }
        let wide = backend.from_host(HostBuffer::F32(local), &[self.per(b)])?;
        let mut out = backend.zeros(&[self.per(b)], dtype)?;
        backend.cast(&wide, &mut out).with_context(|| format!("rounding bucket {b} to {dtype}"))?;
        backend.to_host(&out)
    }
}

/// `t` as fp32 values (half values widened: exact).
fn host(backend: &dyn Backend, t: &DeviceTensor, what: &str) -> Result<Vec<f32>> {
    match backend.to_host(t)? {
        HostBuffer::F32(v) => Ok(v),
        b @ (HostBuffer::BF16(_) | HostBuffer::F16(_)) => Ok(b.to_f32_vec()),
        other => bail!("the distributed optimizer needs float {what}, got {}", other.dtype()),
    }
}

/// The range `range` of a per-parameter checkpoint tensor (or parameter value) as fp32.
fn slice_state(
    backend: &dyn Backend,
    t: &DeviceTensor,
    range: std::ops::Range<usize>,
    what: &str,
) -> Result<DeviceTensor> {
    let v = host(backend, t, what)?;
    if v.len() < range.end {
        bail!("optimizer state `{what}` holds {} values, its parameter needs {}", v.len(), range.end);
    }
    let n = range.len();
    backend.from_host(HostBuffer::F32(v[range].to_vec()), &[n])
}

impl Optimizer for DistributedOptimizer {
    fn name(&self) -> &str {
        "adam"
    }

    /// Expects the gradients reduce-scattered (valid on this rank's ranges) and clipped.
    fn step(&mut self, params: &mut [&mut Param], lr: f64, weight_decay: f64, backend: &dyn Backend) -> Result<()> {
        // Overlap: the previous step's gathers must have landed before the parameters are read
        // (fp32 parameters are the main parameters) and before their buckets are launched again.
        if let Some(mut g) = self.lock_overlap()? {
            g.finish(params)?;
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
                // The segment's fp32 main values: kept (half parameters after their first
                // step) or read from the parameter (fp32: exact; half: widened, exact).
                let mut main = match seg.main.take() {
                    Some(m) => m,
                    None => {
                        let value = host(backend, &p.value, "parameters")?;
                        backend.from_host(HostBuffer::F32(value[range].to_vec()), &[seg.len])?
                    }
                };
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
                if self.half.contains(&seg.name) {
                    seg.main = Some(main);
                }
            }
            let local = self.round(b, local, backend)?;
            if let Some(mut g) = self.lock_overlap()? {
                g.launch(b, local)?; // written by the next forward's pre-hooks
                continue;
            }
            // Every rank's updated range back into the full parameters.
            let full = self.gather(b, local, backend)?;
            for (name, off, numel) in &self.buckets[b].params {
                let p = &mut *params[find(name)?];
                let src = backend.from_host(slice(&full, *off..off + numel)?, p.value.shape())?;
                // A bucket of mixed dtypes gathers fp32: rounded into a half parameter here.
                copy_any(backend, &src, &mut p.value).with_context(|| format!("writing the updated `{name}`"))?;
            }
        }
        // Every step, so the plain Adam's step count (bias correction) stays this one's.
        let mut rest: Vec<&mut Param> =
            params.iter_mut().filter(|p| self.unsharded.contains(&p.name)).map(|p| &mut **p).collect();
        self.plain.get().step(&mut rest, lr, weight_decay, backend)
    }

    fn steps(&self) -> u64 {
        self.steps
    }

    /// Per-parameter moments and (half parameters) fp32 main values, gathered over the group
    /// (a collective; see the module doc).
    fn state(&self, backend: &dyn Backend) -> Result<OptimizerState> {
        let mut tensors = Vec::new();
        // Never stepped: no state, as plain Adam (all ranks agree on `steps`).
        if self.steps > 0 {
            for b in 0..self.buckets.len() {
                let has_half = self.buckets[b].params.iter().any(|p| self.half.contains(&p.0));
                for kind in KINDS.iter().copied().chain(has_half.then_some(MAIN_PARAM)) {
                    let mut local = vec![0f32; self.per(b)];
                    for seg in &self.segments[b] {
                        let t = match kind {
                            MAIN_PARAM if !self.half.contains(&seg.name) => continue,
                            MAIN_PARAM => seg.main.as_ref(),
                            _ => seg.state.as_ref().map(|st| &st[usize::from(kind == KINDS[1])]),
                        };
                        let t = t.ok_or_else(|| anyhow!("`{}` has no optimizer state `{kind}`", seg.name))?;
                        local[seg.shard_offset..seg.shard_offset + seg.len].copy_from_slice(&host(backend, t, kind)?);
                    }
                    let full = self.gather(b, HostBuffer::F32(local), backend)?.to_f32_vec();
                    for (name, off, numel) in &self.buckets[b].params {
                        if kind == MAIN_PARAM && !self.half.contains(name) {
                            continue;
                        }
                        let t =
                            backend.from_host(HostBuffer::F32(full[*off..off + numel].to_vec()), &self.shapes[name])?;
                        tensors.push((format!("{name}.{kind}"), clone_tensor(backend, &t)?));
                    }
                }
            }
            tensors.extend(self.plain.get_ref().state(backend)?.tensors);
        }
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(OptimizerState { scalars: serde_json::json!({ "step": self.steps }), tensors })
    }

    /// Takes per-parameter moments and main values (from this optimizer, plain Adam or the
    /// mixed-precision Adam, any DP size) and keeps this rank's ranges. A half parameter
    /// without a stored main value (a state of an fp32 run) starts from its value in `params`
    /// (the loaded weights).
    fn load_state(&mut self, mut state: OptimizerState, params: &[&Param], backend: &dyn Backend) -> Result<()> {
        let mut mains = take_main_params(&mut state);
        // The parameters outside the buckets go to the plain optimizer with their own tensors.
        let owner = |key: &str| -> Option<String> {
            KINDS.iter().find_map(|k| key.strip_suffix(k).and_then(|p| p.strip_suffix('.'))).map(str::to_string)
        };
        let (plain_tensors, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut state.tensors)
            .into_iter()
            .partition(|(k, _)| owner(k).is_some_and(|n| self.unsharded.contains(&n)));
        let mut plain_state = OptimizerState { scalars: state.scalars.clone(), tensors: plain_tensors };
        if let Plain::Half(_) = self.plain {
            for n in &self.unsharded {
                if let Some(t) = mains.remove(n) {
                    plain_state.tensors.push((format!("{n}.{MAIN_PARAM}"), t));
                }
            }
        }
        let (plain_params, bucketed): (Vec<&Param>, Vec<&Param>) =
            params.iter().copied().partition(|p| self.unsharded.contains(&p.name));
        self.plain.get().load_state(plain_state, &plain_params, backend)?;
        state.tensors = rest;
        let (steps, states) = state_tensors::load(state, &KINDS, "adam", &bucketed, backend)?;
        self.steps = steps;
        let by_name: HashMap<&str, &Param> = params.iter().map(|p| (p.name.as_str(), *p)).collect();
        for seg in self.segments.iter_mut().flatten() {
            let range = seg.start..seg.start + seg.len;
            seg.state = match states.get(&seg.name) {
                None => None,
                Some(ts) => Some([
                    slice_state(backend, &ts[0], range.clone(), "exp_avg")?,
                    slice_state(backend, &ts[1], range.clone(), "exp_avg_sq")?,
                ]),
            };
            seg.main = if !self.half.contains(&seg.name) {
                None
            } else if let Some(t) = mains.get(&seg.name) {
                let want: usize = self.shapes[&seg.name].iter().product();
                if t.numel() != want {
                    bail!(
                        "main parameter of `{}` has shape {:?}, the parameter {:?}: the checkpoint was saved for \
                         another model or layout",
                        seg.name,
                        t.shape(),
                        self.shapes[&seg.name]
                    );
                }
                Some(slice_state(backend, t, range, MAIN_PARAM)?)
            } else if steps > 0 {
                let p = by_name.get(seg.name.as_str()).ok_or_else(|| anyhow!("no parameter `{}` to load", seg.name))?;
                Some(slice_state(backend, &p.value, range, "parameters")?)
            } else {
                None
            };
        }
        Ok(())
    }
}
