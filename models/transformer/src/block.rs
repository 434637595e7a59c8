//! [`TransformerBlock`]: `L` transformer layers and the final norm (`decoder.*`), or one
//! pipeline stage's range of them. It owns the residual stream buffers and the backward
//! scratch, allocated once per `(B, T)` shape.

use crate::attention::LayerKvCache;
use crate::init::ModuleBuilder;
use crate::layer::TransformerLayer;
use crate::norm::NormLayer;
use crate::recompute::FullRecompute;
use crate::spec::{SpecProvider, TransformerBlockSpec, TransformerConfig};
use crate::step::{copy_any, empty, ensure_buffer, BackwardScratch, SavedActivations, StepInfo};
use anyhow::{bail, Result};
use megatron_core::{run_forward_pre_hook, Backend, DType, DeviceTensor, Param, SharedForwardPreHook};
use std::ops::Range;
use std::sync::Arc;

pub struct TransformerBlock {
    backend: Arc<dyn Backend>,
    hidden: usize,
    /// dtype of the residual stream (and of `output` without a final norm) and of the final
    /// norm's output (the activation dtype).
    residual_dtype: DType,
    output_dtype: DType,
    /// The TP size when the residual stream is sequence-parallel (`(N/tp, C)` token shards).
    sequence_parallel: Option<usize>,
    pub layers: Vec<TransformerLayer>,
    pub final_layernorm: Option<Box<dyn NormLayer>>,
    /// `residuals[0]` is the block input, `residuals[l + 1]` the output of layer `l`.
    residuals: Vec<DeviceTensor>, // L+1 x (B, T, C)
    output: DeviceTensor,     // (B, T, C): final norm output
    d_residual: DeviceTensor, // (B, T, C): gradient of the residual stream in backward
    scratch: BackwardScratch,
    /// `--recompute-granularity full` ([`crate::recompute`]); `None` keeps every activation.
    recompute: Option<FullRecompute>,
    /// Activation sets of recomputed layers while no layer uses them (at most one unit's
    /// worth): a recompute reuses these buffers instead of allocating.
    pool: Vec<SavedActivations>,
    /// `--overlap-param-gather`: called with each layer's (and the final norm's) parameters
    /// before its training or evaluation forward ([`megatron_core::forward_pre_hook`]).
    pre_hook: Option<SharedForwardPreHook>,
}

impl TransformerBlock {
    /// Builds `{prefix}.layers.{i}.*` and `{prefix}.final_layernorm.*`.
    pub fn new(
        b: &ModuleBuilder,
        provider: &dyn SpecProvider,
        prefix: &str,
        cfg: &TransformerConfig,
        spec: &TransformerBlockSpec,
    ) -> Result<TransformerBlock> {
        TransformerBlock::new_stage(b, provider, prefix, cfg, spec, 0..cfg.num_layers, true)
    }

    /// One pipeline stage's part of the block (SPEC §5.5): layers `layers` of the
    /// `cfg.num_layers`-layer stack, keeping their GLOBAL numbers (parameter names, dropout
    /// seeds; init depends on the name only, so a stage's parameters equal the whole model's),
    /// and the final norm when `with_final_norm` (the last stage). Without the final norm the
    /// block output is the last layer's residual stream.
    pub fn new_stage(
        b: &ModuleBuilder,
        provider: &dyn SpecProvider,
        prefix: &str,
        cfg: &TransformerConfig,
        spec: &TransformerBlockSpec,
        layers: Range<usize>,
        with_final_norm: bool,
    ) -> Result<TransformerBlock> {
        cfg.validate(b.tp_size())?;
        if spec.layers.len() != cfg.num_layers {
            bail!("block spec has {} layer specs but num_layers is {}", spec.layers.len(), cfg.num_layers);
        }
        if layers.is_empty() || layers.end > cfg.num_layers {
            bail!("pipeline stage layers {layers:?} are not a non-empty range of the {} layers", cfg.num_layers);
        }
        let layers = layers
            .map(|i| TransformerLayer::new(b, provider, &format!("{prefix}.layers.{i}"), cfg, &spec.layers[i], i))
            .collect::<Result<Vec<_>>>()?;
        let final_layernorm = match spec.final_layernorm.filter(|_| with_final_norm) {
            Some(kind) => Some(provider.norm(
                b,
                &format!("{prefix}.final_layernorm"),
                kind,
                cfg.hidden_size,
                cfg.layernorm_epsilon,
            )?),
            None => None,
        };
        let backend = b.backend.clone();
        let bk = backend.as_ref();
        let residual_dtype = b.precision.residual;
        let output_dtype = if final_layernorm.is_some() { b.dtype() } else { residual_dtype };
        Ok(TransformerBlock {
            hidden: cfg.hidden_size,
            residual_dtype,
            output_dtype,
            sequence_parallel: b.sequence_parallel.then_some(b.tp_size()),
            residuals: (0..=layers.len()).map(|_| empty(bk)).collect::<Result<_>>()?,
            output: empty(bk)?,
            d_residual: empty(bk)?,
            scratch: BackwardScratch::new(bk)?,
            recompute: None,
            pool: Vec::new(),
            pre_hook: None,
            layers,
            final_layernorm,
            backend,
        })
    }

    /// Shape of the residual stream (block input and output, pipeline p2p tensors) for
    /// `step`: `(B, T, C)`, or this rank's `(B·T/tp, C)` token shard with sequence parallelism
    /// (see [`crate::sequence_parallel`]).
    pub fn hidden_shape(&self, step: &StepInfo) -> Result<Vec<usize>> {
        match self.sequence_parallel {
            None => Ok(vec![step.batch, step.seq, self.hidden]),
            Some(tp) => {
                if !step.seq.is_multiple_of(tp) {
                    bail!(
                        "--sequence-parallel needs the sequence length {} to be divisible by \
                         --tensor-model-parallel-size {tp}",
                        step.seq
                    );
                }
                Ok(vec![step.tokens() / tp, self.hidden])
            }
        }
    }

    /// The residual stream input buffer ([`Self::hidden_shape`]), sized for `step`: the
    /// embedding writes into it.
    pub fn input_mut(&mut self, step: &StepInfo) -> Result<&mut DeviceTensor> {
        let shape = self.hidden_shape(step)?;
        let bk = self.backend.as_ref();
        let inner = self.inner_residuals(step);
        let kept = self.residuals.iter_mut().enumerate().filter(|(i, _)| !inner.contains(i)).map(|(_, t)| t);
        for t in kept.chain([&mut self.d_residual]) {
            ensure_buffer(bk, t, &shape, self.residual_dtype)?;
        }
        ensure_buffer(bk, &mut self.output, &shape, self.output_dtype)?;
        Ok(&mut self.residuals[0])
    }

    /// Runs every layer and the final norm on the input written through [`Self::input_mut`].
    /// In training with full recomputation, a recomputed layer's activations go back to the
    /// pool right after its forward, and a unit's inner residuals are dropped once consumed.
    pub fn forward(&mut self, step: &StepInfo) -> Result<()> {
        let units = self.recompute_units(step);
        for (l, unit) in units.iter().enumerate() {
            run_forward_pre_hook(self.pre_hook.as_ref(), self.layers[l].params_mut())?;
            self.run_layer(l, step, unit.is_some())?;
            if let Some(u) = unit {
                self.release_layer(l, u)?;
            }
        }
        if let Some(norm) = self.final_layernorm.as_mut() {
            run_forward_pre_hook(self.pre_hook.as_ref(), norm.params_mut())?;
        }
        let last = &self.residuals[self.layers.len()];
        match self.final_layernorm.as_mut() {
            Some(norm) => norm.forward(last, &mut self.output),
            None => copy_any(self.backend.as_ref(), last, &mut self.output),
        }
    }

    /// One empty [`LayerKvCache`] per layer of this block (inference only).
    pub fn new_kv_caches(&self, batch: usize, capacity: usize) -> Result<Vec<LayerKvCache>> {
        self.layers.iter().map(|l| l.self_attention.new_kv_cache(batch, capacity)).collect()
    }

    /// Inference forward of the `step.seq` new tokens written through [`Self::input_mut`],
    /// every layer reading and extending its cache at `offset` (`caches[l]` for layer `l`).
    pub fn forward_cached(
        &mut self,
        step: &StepInfo,
        caches: &mut [LayerKvCache],
        offset: usize,
        key_start: Option<&DeviceTensor>,
    ) -> Result<()> {
        if self.sequence_parallel.is_some() {
            bail!("incremental decoding does not run with --sequence-parallel; load the model at tp = 1");
        }
        if caches.len() != self.layers.len() {
            bail!("{} kv caches given for a block of {} layers", caches.len(), self.layers.len());
        }
        self.ensure_residuals()?;
        for (l, (layer, cache)) in self.layers.iter_mut().zip(caches.iter_mut()).enumerate() {
            let (done, rest) = self.residuals.split_at_mut(l + 1);
            layer.forward_cached(&done[l], &mut rest[0], cache, offset, key_start, step)?;
        }
        let last = &self.residuals[self.layers.len()];
        match self.final_layernorm.as_mut() {
            Some(norm) => norm.forward(last, &mut self.output),
            None => copy_any(self.backend.as_ref(), last, &mut self.output),
        }
    }

    /// dtype of the residual stream (what a pipeline stage sends and receives).
    pub fn residual_dtype(&self) -> DType {
        self.residual_dtype
    }

    /// Continuous batching: [`Self::forward_cached`] with row `r` in cache slot `slots[r]`
    /// holding `offsets[r]` tokens (see [`crate::SelfAttention::forward_slots`]).
    pub fn forward_slots(
        &mut self,
        step: &StepInfo,
        caches: &mut [LayerKvCache],
        slots: &[usize],
        offsets: &[usize],
    ) -> Result<()> {
        if caches.len() != self.layers.len() {
            bail!("{} kv caches given for a block of {} layers", caches.len(), self.layers.len());
        }
        self.ensure_residuals()?;
        for (l, (layer, cache)) in self.layers.iter_mut().zip(caches.iter_mut()).enumerate() {
            let (done, rest) = self.residuals.split_at_mut(l + 1);
            layer.forward_slots(&done[l], &mut rest[0], cache, slots, offsets, step)?;
        }
        let last = &self.residuals[self.layers.len()];
        match self.final_layernorm.as_mut() {
            Some(norm) => norm.forward(last, &mut self.output),
            None => self.backend.copy(last, &mut self.output),
        }
    }

    /// The `(B, T, C)` block output of the last forward.
    pub fn output(&self) -> &DeviceTensor {
        &self.output
    }

    /// Backpropagates `d_output (B, T, C)` through the block; returns `dL/d input (B, T, C)`.
    pub fn backward(&mut self, d_output: &DeviceTensor, step: &StepInfo) -> Result<&DeviceTensor> {
        self.backward_with_hook(d_output, step, &mut |_| Ok(()))
    }

    /// [`Self::backward`], calling `on_grads_ready` with the final norm's parameters and then
    /// each layer's, last layer first, as soon as their gradients of this call are accumulated
    /// (a data-parallel reducer overlaps with the rest of backward).
    pub fn backward_with_hook(
        &mut self,
        d_output: &DeviceTensor,
        step: &StepInfo,
        on_grads_ready: &mut dyn FnMut(&[&Param]) -> Result<()>,
    ) -> Result<&DeviceTensor> {
        let last = &self.residuals[self.layers.len()];
        match self.final_layernorm.as_mut() {
            Some(norm) => {
                norm.backward(d_output, last, &mut self.d_residual)?;
                on_grads_ready(&norm.params())?;
            }
            None => copy_any(self.backend.as_ref(), d_output, &mut self.d_residual)?,
        }
        let units = self.recompute_units(step);
        for l in (0..self.layers.len()).rev() {
            if let Some(u) = units[l].clone().filter(|u| l + 1 == u.end) {
                self.recompute_unit(u, step)?;
            }
            let layer = &mut self.layers[l];
            layer.backward(&self.residuals[l], &mut self.d_residual, &mut self.scratch, step)?;
            on_grads_ready(&layer.params())?;
            if let Some(u) = &units[l] {
                self.release_layer(l, u)?;
            }
        }
        Ok(&self.d_residual)
    }

    /// Turns full recomputation on (or off with `None`) for the following training steps.
    pub fn set_full_recompute(&mut self, recompute: Option<FullRecompute>) -> Result<()> {
        if recompute.is_some_and(|r| r.num_layers == 0) {
            bail!("--recompute-num-layers must be at least 1");
        }
        self.recompute = recompute;
        Ok(())
    }

    /// For each layer, its recompute unit in a training step (all `None` otherwise).
    fn recompute_units(&self, step: &StepInfo) -> Vec<Option<Range<usize>>> {
        match self.recompute.filter(|_| step.train) {
            Some(r) => r.unit_of_layers(self.layers.len()),
            None => vec![None; self.layers.len()],
        }
    }

    /// Residual indices that a training step drops after use (inside a unit of several layers).
    fn inner_residuals(&self, step: &StepInfo) -> Vec<usize> {
        let units = self.recompute_units(step);
        (0..self.layers.len()).filter(|&l| units[l].as_ref().is_some_and(|u| l > u.start)).collect()
    }

    /// Sizes `residuals[i]` like the block input (a no-op unless it was dropped).
    fn ensure_residual(&mut self, i: usize) -> Result<()> {
        let shape = self.residuals[0].shape().to_vec();
        ensure_buffer(self.backend.as_ref(), &mut self.residuals[i], &shape, self.residual_dtype)
    }

    /// Every residual after the input sized (decoding after a recomputing training step).
    fn ensure_residuals(&mut self) -> Result<()> {
        (1..=self.layers.len()).try_for_each(|i| self.ensure_residual(i))
    }

    /// Layer `l`'s training forward from `residuals[l]` into `residuals[l + 1]`, on pooled
    /// buffers when it is `recomputed`.
    fn run_layer(&mut self, l: usize, step: &StepInfo, recomputed: bool) -> Result<()> {
        self.ensure_residual(l + 1)?;
        if recomputed {
            self.lend_buffers(l)?;
        }
        let (done, rest) = self.residuals.split_at_mut(l + 1);
        self.layers[l].forward(&done[l], &mut rest[0], step)
    }

    /// Once layer `l` of recompute unit `unit` is done with its activations (after its forward,
    /// and again after its backward): they go back to the pool, and its input is dropped when it
    /// is inside the unit (rebuilt by the unit's recompute).
    fn release_layer(&mut self, l: usize, unit: &Range<usize>) -> Result<()> {
        self.reclaim_buffers(l)?;
        if l > unit.start {
            self.residuals[l] = empty(self.backend.as_ref())?;
        }
        Ok(())
    }

    /// Gives layer `l` a pooled set of activation buffers of its kind, if there is one (else it
    /// allocates in its forward).
    fn lend_buffers(&mut self, l: usize) -> Result<()> {
        let n = self.layers[l].saved_activations_mut().len();
        if let Some(i) = self.pool.iter().position(|s| s.len() == n) {
            let mut set = self.pool.swap_remove(i);
            set.swap_with(self.layers[l].saved_activations_mut())?; // `set` now holds placeholders
        }
        Ok(())
    }

    /// Moves layer `l`'s activations into the pool, leaving empty placeholders in the layer.
    fn reclaim_buffers(&mut self, l: usize) -> Result<()> {
        let slots = self.layers[l].saved_activations_mut();
        let mut set = SavedActivations::placeholders(self.backend.as_ref(), slots.len())?;
        set.swap_with(slots)?;
        self.pool.push(set);
        Ok(())
    }

    /// Re-runs the forward of the layers of `unit` from its kept input, so their activations
    /// (and the unit's inner residuals) are in place for their backward. The same `step` gives
    /// the same dropout masks: the activations are bit-identical to the first forward's.
    /// An MLP-slot plugin (MoE) is told the forward is a recomputation, so it counts its routing
    /// statistics, metrics and expert-bias token counts once (in the first forward).
    fn recompute_unit(&mut self, unit: Range<usize>, step: &StepInfo) -> Result<()> {
        for l in unit {
            self.layers[l].mlp.set_recomputing(true)?;
            let run = self.run_layer(l, step, true);
            self.layers[l].mlp.set_recomputing(false)?;
            run?;
        }
        Ok(())
    }

    /// Everything the last forward saved for backward: the residual stream `(L+1)·(B, T, C)`,
    /// the output `(B, T, C)`, and every layer's and the final norm's tensors, in a fixed order
    /// (see [`crate::step::SavedActivations`]). The backward scratch and `d_residual` are not
    /// listed: only one backward runs at a time, so they stay shared.
    pub fn saved_activations_mut(&mut self) -> Vec<&mut DeviceTensor> {
        let mut v: Vec<&mut DeviceTensor> = self.residuals.iter_mut().chain([&mut self.output]).collect();
        for layer in self.layers.iter_mut() {
            v.extend(layer.saved_activations_mut());
        }
        if let Some(norm) = self.final_layernorm.as_mut() {
            v.extend(norm.saved_activations_mut());
        }
        v
    }

    /// Bytes of everything [`Self::saved_activations_mut`] lists now, plus the recompute pool.
    pub fn activation_bytes(&mut self) -> usize {
        let held: usize = self.saved_activations_mut().iter().map(|t| t.numel() * t.dtype().size()).sum();
        held + self.pooled_activation_bytes()
    }

    /// Bytes of the recompute pool (activation sets of recomputed layers not in use).
    pub fn pooled_activation_bytes(&self) -> usize {
        self.pool.iter().map(|s| s.bytes()).sum()
    }

    pub fn params(&self) -> Vec<&Param> {
        let mut p: Vec<&Param> = self.layers.iter().flat_map(|l| l.params()).collect();
        if let Some(norm) = &self.final_layernorm {
            p.extend(norm.params());
        }
        p
    }

    pub fn buffers(&self) -> Vec<&Param> {
        self.layers.iter().flat_map(|l| l.buffers()).collect()
    }

    pub fn buffers_mut(&mut self) -> Vec<&mut Param> {
        self.layers.iter_mut().flat_map(|l| l.buffers_mut()).collect()
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut p: Vec<&mut Param> = self.layers.iter_mut().flat_map(|l| l.params_mut()).collect();
        if let Some(norm) = self.final_layernorm.as_mut() {
            p.extend(norm.params_mut());
        }
        p
    }

    /// Installs the `--overlap-param-gather` forward pre-hook ([`Self::forward`] calls it per
    /// layer); the model calls [`Self::run_pre_hook`] for its own modules.
    pub fn set_forward_pre_hook(&mut self, hook: Option<SharedForwardPreHook>) {
        self.pre_hook = hook;
    }

    /// Runs the installed forward pre-hook (if any) on `params` of a module outside the block
    /// (embedding, output layer) before its forward.
    pub fn run_pre_hook(&self, params: Vec<&mut Param>) -> Result<()> {
        run_forward_pre_hook(self.pre_hook.as_ref(), params)
    }
}
