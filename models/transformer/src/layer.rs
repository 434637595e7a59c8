//! One pre-norm transformer layer (SPEC §4.1):
//! `h1 = x + dropout(attn(norm1(x)))`, `y = h1 + dropout(mlp(norm2(h1)))`.
//!
//! Activation memory kept per layer for backward (elements of the activation dtype, 4 bytes
//! in fp32 and 2 in bf16/fp16, see [`crate::precision`]; `N = B*T`, `C` hidden,
//! `F` ffn, `np` heads, all divided by `tp` where the layer is tensor-parallel):
//! the layer input `x` (`N·C`, owned by the block), `norm1(x)`, `h1`, `norm2(h1)` (`3·N·C`),
//! `qkv` (`3·N·C/tp`), the attention context (`N·C/tp`), `fc1` and activation outputs
//! (`2·N·F/tp`, `3·N·F/tp` gated), the softmax log-sum-exp (`B·np/tp·T`) and the norm
//! statistics (`≤ 4N`). With `F = 4C`, tp = 1: about `16·N·C` floats per layer, e.g.
//! GPT-2 124M at B=4, T=1024 (C=768): 201 MB per layer, 2.4 GB for 12 layers.
//! Dropout masks are not stored: they are regenerated from their seeds.

use crate::attention::{LayerKvCache, SelfAttention};
use crate::init::ModuleBuilder;
use crate::mlp_slot::MlpSlot;
use crate::norm::NormLayer;
use crate::spec::{SpecProvider, TransformerConfig, TransformerLayerSpec};
use crate::step::{empty, ensure_buffer, BackwardScratch, DropoutSite, StepInfo};
use anyhow::{Context, Result};
use megatron_core::{Backend, DType, DeviceTensor, Param};
use std::sync::Arc;

pub struct TransformerLayer {
    backend: Arc<dyn Backend>,
    /// 0-based index within the block (parameter names and dropout seeds).
    pub layer_number: usize,
    pub input_layernorm: Box<dyn NormLayer>,
    pub self_attention: SelfAttention,
    pub pre_mlp_layernorm: Box<dyn NormLayer>,
    pub mlp: MlpSlot,
    hidden_dropout: f32,
    /// dtype of the norm outputs (the parameter dtype) and of the residual stream `h1`.
    act: DType,
    residual: DType,
    /// `Some(tp_rank)` under sequence parallelism: the residual stream is this rank's token
    /// shard `(N/tp, C)` and the dropout masks come from the TP rank's stream.
    sequence_parallel: Option<usize>,
    ln1_out: DeviceTensor, // (B, T, C)
    h1: DeviceTensor,      // (B, T, C)
    ln2_out: DeviceTensor, // (B, T, C)
}

impl TransformerLayer {
    /// Builds the modules of `{prefix}` (e.g. `decoder.layers.3`) from `spec` via `provider`.
    pub fn new(
        b: &ModuleBuilder,
        provider: &dyn SpecProvider,
        prefix: &str,
        cfg: &TransformerConfig,
        spec: &TransformerLayerSpec,
        layer_number: usize,
    ) -> Result<TransformerLayer> {
        let (h, eps) = (cfg.hidden_size, cfg.layernorm_epsilon);
        let backend = b.backend.clone();
        Ok(TransformerLayer {
            input_layernorm: provider.norm(b, &format!("{prefix}.input_layernorm"), spec.input_layernorm, h, eps)?,
            self_attention: SelfAttention::new(
                b,
                provider,
                &format!("{prefix}.self_attention"),
                cfg,
                spec.self_attention,
                layer_number,
            )?,
            pre_mlp_layernorm: provider.norm(
                b,
                &format!("{prefix}.pre_mlp_layernorm"),
                spec.pre_mlp_layernorm,
                h,
                eps,
            )?,
            mlp: MlpSlot::new(b, provider, &format!("{prefix}.mlp"), cfg, spec.mlp, layer_number)?,
            hidden_dropout: cfg.hidden_dropout,
            act: b.dtype(),
            residual: b.precision.residual,
            sequence_parallel: b.sequence_parallel.then_some(b.tp_rank()),
            layer_number,
            ln1_out: empty(backend.as_ref())?,
            h1: empty(backend.as_ref())?,
            ln2_out: empty(backend.as_ref())?,
            backend,
        })
    }

    /// `y (B, T, C)` from `x (B, T, C)`; in training keeps what backward needs.
    /// With sequence parallelism `x`, `y` and the norm/residual buffers are the `(N/tp, C)`
    /// token shard (the linears gather and scatter, see [`crate::sequence_parallel`]).
    pub fn forward(&mut self, x: &DeviceTensor, y: &mut DeviceTensor, step: &StepInfo) -> Result<()> {
        let shape = x.shape().to_vec(); // (B, T, C), or (N/tp, C) with sequence parallelism
        let backend = self.backend.as_ref();
        ensure_buffer(backend, &mut self.ln1_out, &shape, self.act)?;
        ensure_buffer(backend, &mut self.h1, &shape, self.residual)?;
        ensure_buffer(backend, &mut self.ln2_out, &shape, self.act)?;
        self.input_layernorm.forward(x, &mut self.ln1_out)?;
        // h1 = x + dropout(attn(ln1(x))): the branch is written into h1, then x is added.
        self.self_attention.forward(&self.ln1_out, &mut self.h1, step)?;
        let (p, layer, sp) = (self.hidden_dropout, self.layer_number, self.sequence_parallel);
        hidden_dropout_in(backend, &mut self.h1, p, layer, DropoutSite::AttentionOutput, step, sp)?;
        backend.axpy(&mut self.h1, 1.0, x)?;
        self.pre_mlp_layernorm.forward(&self.h1, &mut self.ln2_out)?;
        // y = h1 + dropout(mlp(ln2(h1))).
        self.mlp.forward(&self.ln2_out, y, step)?;
        hidden_dropout_in(backend, y, p, layer, DropoutSite::MlpOutput, step, sp)?;
        backend.axpy(y, 1.0, &self.h1)
    }

    /// Inference forward of `x (B, Tq, C)` (the new tokens) into `y`, with the attention reading
    /// and extending `cache` (see [`SelfAttention::forward_cached`]). No dropout.
    pub fn forward_cached(
        &mut self,
        x: &DeviceTensor,
        y: &mut DeviceTensor,
        cache: &mut LayerKvCache,
        offset: usize,
        key_start: Option<&DeviceTensor>,
        step: &StepInfo,
    ) -> Result<()> {
        if self.sequence_parallel.is_some() {
            anyhow::bail!("incremental decoding does not run with --sequence-parallel; load the model at tp = 1");
        }
        let shape = [step.batch, step.seq, x.numel() / step.tokens().max(1)];
        let backend = self.backend.as_ref();
        ensure_buffer(backend, &mut self.ln1_out, &shape, self.act)?;
        ensure_buffer(backend, &mut self.h1, &shape, self.residual)?;
        ensure_buffer(backend, &mut self.ln2_out, &shape, self.act)?;
        self.input_layernorm.forward(x, &mut self.ln1_out)?;
        self.self_attention.forward_cached(&self.ln1_out, &mut self.h1, cache, offset, key_start, step)?;
        backend.axpy(&mut self.h1, 1.0, x)?;
        self.pre_mlp_layernorm.forward(&self.h1, &mut self.ln2_out)?;
        self.mlp.forward(&self.ln2_out, y, step)?;
        backend.axpy(y, 1.0, &self.h1)
    }

    /// Continuous batching: [`Self::forward_cached`] with one cache slot and offset per row
    /// (see [`SelfAttention::forward_slots`]).
    pub fn forward_slots(
        &mut self,
        x: &DeviceTensor,
        y: &mut DeviceTensor,
        cache: &mut LayerKvCache,
        slots: &[usize],
        offsets: &[usize],
        step: &StepInfo,
    ) -> Result<()> {
        if self.sequence_parallel.is_some() {
            anyhow::bail!("incremental decoding does not run with --sequence-parallel; load the model at tp = 1");
        }
        let shape = [step.batch, step.seq, x.numel() / step.tokens().max(1)];
        let backend = self.backend.as_ref();
        ensure_buffer(backend, &mut self.ln1_out, &shape, self.act)?;
        ensure_buffer(backend, &mut self.h1, &shape, self.residual)?;
        ensure_buffer(backend, &mut self.ln2_out, &shape, self.act)?;
        self.input_layernorm.forward(x, &mut self.ln1_out)?;
        self.self_attention.forward_slots(&self.ln1_out, &mut self.h1, cache, slots, offsets, step)?;
        backend.axpy(&mut self.h1, 1.0, x)?;
        self.pre_mlp_layernorm.forward(&self.h1, &mut self.ln2_out)?;
        self.mlp.forward(&self.ln2_out, y, step)?;
        backend.axpy(y, 1.0, &self.h1)
    }

    /// On entry `d_res (B, T, C)` is `dL/dy`; on exit it is `dL/dx` (the residual stream's
    /// gradient flows through unchanged, each branch adds its part). `x` is this layer's input.
    pub fn backward(
        &mut self,
        x: &DeviceTensor,
        d_res: &mut DeviceTensor,
        scratch: &mut BackwardScratch,
        step: &StepInfo,
    ) -> Result<()> {
        let backend = self.backend.clone();
        let BackwardScratch { d_branch, d_norm, inner } = scratch;
        // d_branch carries residual-stream gradients, d_norm the norms' (activation dtype).
        ensure_buffer(backend.as_ref(), d_branch, d_res.shape(), d_res.dtype())?;
        ensure_buffer(backend.as_ref(), d_norm, d_res.shape(), self.act)?;
        let (p, layer, sp) = (self.hidden_dropout, self.layer_number, self.sequence_parallel);
        let ctx = || format!("backward of decoder layer {layer}");

        // MLP branch: d_branch = dropout(dL/dy) (same mask), through mlp and norm2, into d_res.
        backend.copy(d_res, d_branch)?;
        hidden_dropout_in(backend.as_ref(), d_branch, p, layer, DropoutSite::MlpOutput, step, sp)?;
        self.mlp.backward(&self.ln2_out, d_branch, d_norm, inner).with_context(ctx)?;
        self.pre_mlp_layernorm.backward(d_norm, &self.h1, d_branch).with_context(ctx)?;
        backend.axpy(d_res, 1.0, d_branch)?;

        // Attention branch, same pattern on dL/dh1.
        backend.copy(d_res, d_branch)?;
        hidden_dropout_in(backend.as_ref(), d_branch, p, layer, DropoutSite::AttentionOutput, step, sp)?;
        self.self_attention.backward(&self.ln1_out, d_branch, d_norm, inner, step).with_context(ctx)?;
        self.input_layernorm.backward(d_norm, x, d_branch).with_context(ctx)?;
        backend.axpy(d_res, 1.0, d_branch)
    }

    /// Everything this layer's last forward saved for backward (about `16·N·C` floats, see the
    /// module doc), in a fixed order; the layer input belongs to the block.
    pub fn saved_activations_mut(&mut self) -> Vec<&mut DeviceTensor> {
        let mut v = vec![&mut self.ln1_out, &mut self.h1, &mut self.ln2_out];
        v.extend(self.input_layernorm.saved_activations_mut());
        v.extend(self.self_attention.saved_activations_mut());
        v.extend(self.pre_mlp_layernorm.saved_activations_mut());
        v.extend(self.mlp.saved_activations_mut());
        v
    }

    pub fn params(&self) -> Vec<&Param> {
        let mut p = self.input_layernorm.params();
        p.extend(self.self_attention.params());
        p.extend(self.pre_mlp_layernorm.params());
        p.extend(self.mlp.params());
        p
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut p = self.input_layernorm.params_mut();
        p.extend(self.self_attention.params_mut());
        p.extend(self.pre_mlp_layernorm.params_mut());
        p.extend(self.mlp.params_mut());
        p
    }

    /// Checkpointed non-trained state (the MLP slot's, e.g. an MoE router's expert bias).
    pub fn buffers(&self) -> Vec<&Param> {
        self.mlp.buffers()
    }

    pub fn buffers_mut(&mut self) -> Vec<&mut Param> {
        self.mlp.buffers_mut()
    }
}

/// Inverted dropout of a residual branch in place (a no-op outside training). Backward calls
/// it again on the gradient with the same seed, which applies the same mask and scale.
pub fn hidden_dropout(
    backend: &dyn Backend,
    t: &mut DeviceTensor,
    p: f32,
    layer: usize,
    site: DropoutSite,
    step: &StepInfo,
) -> Result<()> {
    hidden_dropout_in(backend, t, p, layer, site, step, None)
}

/// [`hidden_dropout`] on a sequence-parallel shard when `sequence_parallel` is `Some(tp_rank)`
/// (the mask then comes from that TP rank's stream, [`StepInfo::dropout_seed_in`]).
pub fn hidden_dropout_in(
    backend: &dyn Backend,
    t: &mut DeviceTensor,
    p: f32,
    layer: usize,
    site: DropoutSite,
    step: &StepInfo,
    sequence_parallel: Option<usize>,
) -> Result<()> {
    let p = step.dropout_p(p);
    if p > 0.0 {
        let seed = match sequence_parallel {
            Some(tp_rank) => step.dropout_seed_in(layer, site, tp_rank, true),
            None => step.dropout_seed(layer, site, 0),
        };
        backend.dropout(t, p, seed)?;
    }
    Ok(())
}
