//! [`TransformerBlock`]: `L` transformer layers and the final norm (`decoder.*`), or one
//! pipeline stage's range of them. It owns the residual stream buffers and the backward
//! scratch, allocated once per `(B, T)` shape.

use crate::attention::LayerKvCache;
use crate::init::ModuleBuilder;
use crate::layer::TransformerLayer;
use crate::norm::NormLayer;
use crate::spec::{SpecProvider, TransformerBlockSpec, TransformerConfig};
use crate::step::{copy_any, empty, ensure_buffer, BackwardScratch, StepInfo};
use anyhow::{bail, Result};
use megatron_core::{Backend, DType, DeviceTensor, Param};
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
        for t in self.residuals.iter_mut().chain([&mut self.d_residual]) {
            ensure_buffer(bk, t, &shape, self.residual_dtype)?;
        }
        ensure_buffer(bk, &mut self.output, &shape, self.output_dtype)?;
        Ok(&mut self.residuals[0])
    }

    /// Runs every layer and the final norm on the input written through [`Self::input_mut`].
    pub fn forward(&mut self, step: &StepInfo) -> Result<()> {
        for (l, layer) in self.layers.iter_mut().enumerate() {
            let (done, rest) = self.residuals.split_at_mut(l + 1);
            layer.forward(&done[l], &mut rest[0], step)?;
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
        for (l, layer) in self.layers.iter_mut().enumerate().rev() {
            layer.backward(&self.residuals[l], &mut self.d_residual, &mut self.scratch, step)?;
            on_grads_ready(&layer.params())?;
        }
        Ok(&self.d_residual)
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

    pub fn params(&self) -> Vec<&Param> {
        let mut p: Vec<&Param> = self.layers.iter().flat_map(|l| l.params()).collect();
        if let Some(norm) = &self.final_layernorm {
            p.extend(norm.params());
        }
        p
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut p: Vec<&mut Param> = self.layers.iter_mut().flat_map(|l| l.params_mut()).collect();
        if let Some(norm) = self.final_layernorm.as_mut() {
            p.extend(norm.params_mut());
        }
        p
    }
}
