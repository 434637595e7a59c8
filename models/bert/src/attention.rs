//! [`EncoderAttention`]: BERT's bidirectional self-attention with a key-padding mask (SPEC
//! §4.8): column-parallel `linear_qkv` → `Backend::attention_padded_*` on this rank's `np/tp`
//! heads (row `b` attends among its first `lengths[b]` tokens) → row-parallel `linear_proj`.
//! The fused QKV rows are Megatron's `[np, 3, hn]` layout, as in the GPT attention.

use anyhow::Result;
use megatron_core::{Backend, DeviceTensor, PaddedAttentionSpec, Param};
use megatron_transformer::linear::{LinearConfig, LinearLayer};
use megatron_transformer::step::{empty, ensure_buffer, ensure_shape};
use megatron_transformer::{DropoutSite, ModuleBuilder, ModuleScratch, SpecProvider, StepInfo, TransformerConfig};
use std::sync::Arc;

pub struct EncoderAttention {
    backend: Arc<dyn Backend>,
    pub linear_qkv: Box<dyn LinearLayer>,
    pub linear_proj: Box<dyn LinearLayer>,
    heads_local: usize,
    head_dim: usize,
    attention_dropout: f32,
    layer: usize,
    tp_rank: usize,
    qkv: DeviceTensor,     // (B, T, np/tp, 3, hn) kept as (B, T, 3·C/tp)
    context: DeviceTensor, // (B, T, C/tp)
    lse: DeviceTensor,     // (B, np/tp, T)
}

impl EncoderAttention {
    pub fn new(
        b: &ModuleBuilder,
        provider: &dyn SpecProvider,
        prefix: &str,
        cfg: &TransformerConfig,
        layer: usize,
    ) -> Result<EncoderAttention> {
        let (h, np, hn) = (cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim());
        let qkv = LinearConfig {
            in_features: h,
            out_features: 3 * np * hn,
            bias: true,
            init_std: cfg.init_method_std,
            out_chunks: 1,
        };
        let proj = LinearConfig {
            in_features: np * hn,
            out_features: h,
            bias: true,
            init_std: cfg.output_init_std(),
            out_chunks: 1,
        };
        let backend = b.backend.clone();
        let bk = backend.as_ref();
        Ok(EncoderAttention {
            linear_qkv: provider.column_parallel_linear(b, &format!("{prefix}.linear_qkv"), qkv)?,
            linear_proj: provider.row_parallel_linear(b, &format!("{prefix}.linear_proj"), proj)?,
            heads_local: np / b.tp_size(),
            head_dim: hn,
            attention_dropout: cfg.attention_dropout,
            layer,
            tp_rank: b.tp_rank(),
            qkv: empty(bk)?,
            context: empty(bk)?,
            lse: empty(bk)?,
            backend,
        })
    }

    fn spec(&self, step: &StepInfo) -> PaddedAttentionSpec {
        PaddedAttentionSpec {
            batch: step.batch,
            seq: step.seq,
            heads: self.heads_local,
            head_dim: self.head_dim,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
            dropout_p: step.dropout_p(self.attention_dropout),
            dropout_seed: step.dropout_seed(self.layer, DropoutSite::AttentionProbs, self.tp_rank),
        }
    }

    /// `out (B, T, C)` = attention of `x (B, T, C)` (before the residual dropout-add);
    /// `lengths` int32 `(B)`.
    pub fn forward(
        &mut self,
        x: &DeviceTensor,
        lengths: &DeviceTensor,
        out: &mut DeviceTensor,
        step: &StepInfo,
    ) -> Result<()> {
        let (b, t, np, hn) = (step.batch, step.seq, self.heads_local, self.head_dim);
        let bk = self.backend.clone();
        // qkv and context in the activation dtype: the CPU backend widens a half qkv for its
        // fp32 kernel and rounds the context once; scores, softmax and `lse` are fp32.
        ensure_buffer(bk.as_ref(), &mut self.qkv, &[b, t, np * 3 * hn], x.dtype())?;
        ensure_buffer(bk.as_ref(), &mut self.context, &[b, t, np * hn], x.dtype())?;
        ensure_shape(bk.as_ref(), &mut self.lse, &[b, np, t])?;
        self.linear_qkv.forward(x, &mut self.qkv)?;
        let spec = self.spec(step);
        bk.attention_padded_forward(&self.qkv, lengths, &mut self.context, &mut self.lse, spec)?;
        self.linear_proj.forward(&self.context, out)
    }

    /// Overwrites `d_x (B, T, C)` from `d_out (B, T, C)`; accumulates parameter gradients.
    pub fn backward(
        &mut self,
        x: &DeviceTensor,
        lengths: &DeviceTensor,
        d_out: &DeviceTensor,
        d_x: &mut DeviceTensor,
        scratch: &mut ModuleScratch,
        step: &StepInfo,
    ) -> Result<()> {
        let bk = self.backend.clone();
        ensure_buffer(bk.as_ref(), &mut scratch.d_context, self.context.shape(), d_out.dtype())?;
        self.linear_proj.backward(&self.context, d_out, Some(&mut scratch.d_context))?;
        ensure_buffer(bk.as_ref(), &mut scratch.d_qkv, self.qkv.shape(), d_out.dtype())?;
        let spec = self.spec(step);
        bk.attention_padded_backward(
            &scratch.d_context,
            &self.qkv,
            lengths,
            &self.context,
            &self.lse,
            &mut scratch.d_qkv,
            spec,
        )?;
        self.linear_qkv.backward(x, &scratch.d_qkv, Some(d_x))
    }

    /// Frees what backward needs (full recomputation re-runs [`Self::forward`]).
    pub fn drop_saved(&mut self) -> Result<()> {
        let bk = self.backend.as_ref();
        (self.qkv, self.context, self.lse) = (empty(bk)?, empty(bk)?, empty(bk)?);
        Ok(())
    }

    pub fn params(&self) -> Vec<&Param> {
        self.linear_qkv.params().into_iter().chain(self.linear_proj.params()).collect()
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        self.linear_qkv.params_mut().into_iter().chain(self.linear_proj.params_mut()).collect()
    }
}
