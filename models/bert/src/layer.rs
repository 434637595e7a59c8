//! [`BertLayer`]: one encoder layer with the LayerNorms before the branches (Megatron-Core) or
//! after the residual adds (original BERT / Hugging Face), see [`LayerNormPlacement`].
//!
//! Pre-LN:  `a = LN1(x)`, `h1 = x + drop(attn(a))`, `c = LN2(h1)`, `y = h1 + drop(mlp(c))`.
//! Post-LN: `a = x + drop(attn(x))`, `h1 = LN1(a)`, `c = h1 + drop(mlp(h1))`, `y = LN2(c)`.
//! Per layer this keeps three `(B, T, C)` tensors (`a`, `h1`, `c`) plus the attention's and
//! the MLP's own activations; dropout masks are regenerated from their seeds.

use crate::attention::EncoderAttention;
use crate::config::LayerNormPlacement;
use crate::mlp::BertMlp;
use anyhow::{Context, Result};
use megatron_core::{Backend, DeviceTensor, Param};
use megatron_transformer::layer::hidden_dropout;
use megatron_transformer::step::{empty, ensure_buffer};
use megatron_transformer::{
    BackwardScratch, DropoutSite, ModuleBuilder, NormKind, NormLayer, SpecProvider, StepInfo, TransformerConfig,
};
use std::sync::Arc;

pub struct BertLayer {
    backend: Arc<dyn Backend>,
    pub layer_number: usize,
    placement: LayerNormPlacement,
    /// Pre-LN: before attention (`input_layernorm`); post-LN: after the attention residual
    /// (`post_attention_layernorm`).
    pub norm1: Box<dyn NormLayer>,
    pub self_attention: EncoderAttention,
    /// Pre-LN: before the MLP (`pre_mlp_layernorm`); post-LN: after the MLP residual
    /// (`post_mlp_layernorm`).
    pub norm2: Box<dyn NormLayer>,
    pub mlp: BertMlp,
    hidden_dropout: f32,
    a: DeviceTensor,  // (B, T, C)
    h1: DeviceTensor, // (B, T, C)
    c: DeviceTensor,  // (B, T, C)
}

impl BertLayer {
    pub fn new(
        b: &ModuleBuilder,
        provider: &dyn SpecProvider,
        prefix: &str,
        cfg: &TransformerConfig,
        placement: LayerNormPlacement,
        gelu_erf: bool,
        layer_number: usize,
    ) -> Result<BertLayer> {
        let (h, eps) = (cfg.hidden_size, cfg.layernorm_epsilon);
        let (n1, n2) = match placement {
            LayerNormPlacement::Pre => ("input_layernorm", "pre_mlp_layernorm"),
            LayerNormPlacement::Post => ("post_attention_layernorm", "post_mlp_layernorm"),
        };
        let backend = b.backend.clone();
        let bk = backend.as_ref();
        Ok(BertLayer {
            norm1: provider.norm(b, &format!("{prefix}.{n1}"), NormKind::LayerNorm, h, eps)?,
            self_attention: EncoderAttention::new(b, provider, &format!("{prefix}.self_attention"), cfg, layer_number)?,
            norm2: provider.norm(b, &format!("{prefix}.{n2}"), NormKind::LayerNorm, h, eps)?,
            mlp: BertMlp::new(b, provider, &format!("{prefix}.mlp"), cfg, gelu_erf)?,
            hidden_dropout: cfg.hidden_dropout,
            layer_number,
            placement,
            a: empty(bk)?,
            h1: empty(bk)?,
            c: empty(bk)?,
            backend,
        })
    }

    /// `y (B, T, C)` from `x (B, T, C)`; `lengths` int32 `(B)` (real tokens per row).
    pub fn forward(
        &mut self,
        x: &DeviceTensor,
        lengths: &DeviceTensor,
        y: &mut DeviceTensor,
        step: &StepInfo,
    ) -> Result<()> {
        let bk = self.backend.clone();
        let bk = bk.as_ref();
        for t in [&mut self.a, &mut self.h1, &mut self.c] {
            ensure_buffer(bk, t, x.shape(), x.dtype())?;
        }
        let (p, l) = (self.hidden_dropout, self.layer_number);
        match self.placement {
            LayerNormPlacement::Pre => {
                self.norm1.forward(x, &mut self.a)?;
                self.self_attention.forward(&self.a, lengths, &mut self.h1, step)?;
                hidden_dropout(bk, &mut self.h1, p, l, DropoutSite::AttentionOutput, step)?;
                bk.axpy(&mut self.h1, 1.0, x)?;
                self.norm2.forward(&self.h1, &mut self.c)?;
                self.mlp.forward(&self.c, y, step)?;
                hidden_dropout(bk, y, p, l, DropoutSite::MlpOutput, step)?;
                bk.axpy(y, 1.0, &self.h1)
            }
            LayerNormPlacement::Post => {
                self.self_attention.forward(x, lengths, &mut self.a, step)?;
                hidden_dropout(bk, &mut self.a, p, l, DropoutSite::AttentionOutput, step)?;
                bk.axpy(&mut self.a, 1.0, x)?;
                self.norm1.forward(&self.a, &mut self.h1)?;
                self.mlp.forward(&self.h1, &mut self.c, step)?;
                hidden_dropout(bk, &mut self.c, p, l, DropoutSite::MlpOutput, step)?;
                bk.axpy(&mut self.c, 1.0, &self.h1)?;
                self.norm2.forward(&self.c, y)
            }
        }
    }

    /// On entry `d_res` is `dL/dy`, on exit `dL/dx`; `x` is this layer's input.
    pub fn backward(
        &mut self,
        x: &DeviceTensor,
        lengths: &DeviceTensor,
        d_res: &mut DeviceTensor,
        scratch: &mut BackwardScratch,
        step: &StepInfo,
    ) -> Result<()> {
        let backend = self.backend.clone();
        let bk = backend.as_ref();
        let BackwardScratch { d_branch, d_norm, inner } = scratch;
        ensure_buffer(bk, d_branch, d_res.shape(), d_res.dtype())?;
        ensure_buffer(bk, d_norm, d_res.shape(), d_res.dtype())?;
        let (p, l) = (self.hidden_dropout, self.layer_number);
        let ctx = || format!("backward of bert encoder layer {l}");
        match self.placement {
            LayerNormPlacement::Pre => {
                bk.copy(d_res, d_branch)?;
                hidden_dropout(bk, d_branch, p, l, DropoutSite::MlpOutput, step)?;
                self.mlp.backward(&self.c, d_branch, d_norm, inner).with_context(ctx)?;
                self.norm2.backward(d_norm, &self.h1, d_branch).with_context(ctx)?;
                bk.axpy(d_res, 1.0, d_branch)?;
                bk.copy(d_res, d_branch)?;
                hidden_dropout(bk, d_branch, p, l, DropoutSite::AttentionOutput, step)?;
                self.self_attention.backward(&self.a, lengths, d_branch, d_norm, inner, step).with_context(ctx)?;
                self.norm1.backward(d_norm, x, d_branch).with_context(ctx)?;
                bk.axpy(d_res, 1.0, d_branch)
            }
            LayerNormPlacement::Post => {
                // d_c = LN2'(dy); d_h1 = d_c + mlp'(drop(d_c)).
                self.norm2.backward(d_res, &self.c, d_norm).with_context(ctx)?;
                bk.copy(d_norm, d_res)?; // d_res = d_c
                hidden_dropout(bk, d_norm, p, l, DropoutSite::MlpOutput, step)?;
                self.mlp.backward(&self.h1, d_norm, d_branch, inner).with_context(ctx)?;
                bk.axpy(d_res, 1.0, d_branch)?; // d_res = d_h1
                                                // d_a = LN1'(d_h1); d_x = d_a + attn'(drop(d_a)).
                self.norm1.backward(d_res, &self.a, d_norm).with_context(ctx)?;
                bk.copy(d_norm, d_res)?; // d_res = d_a
                hidden_dropout(bk, d_norm, p, l, DropoutSite::AttentionOutput, step)?;
                self.self_attention.backward(x, lengths, d_norm, d_branch, inner, step).with_context(ctx)?;
                bk.axpy(d_res, 1.0, d_branch)
            }
        }
    }

    /// Frees every tensor kept for backward (full recomputation: the unit's forward is re-run
    /// from its input before the backward).
    pub fn drop_saved(&mut self) -> Result<()> {
        let bk = self.backend.as_ref();
        (self.a, self.h1, self.c) = (empty(bk)?, empty(bk)?, empty(bk)?);
        self.self_attention.drop_saved()?;
        self.mlp.drop_saved()
    }

    pub fn params(&self) -> Vec<&Param> {
        let mut p = self.norm1.params();
        p.extend(self.self_attention.params());
        p.extend(self.norm2.params());
        p.extend(self.mlp.params());
        p
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut p = self.norm1.params_mut();
        p.extend(self.self_attention.params_mut());
        p.extend(self.norm2.params_mut());
        p.extend(self.mlp.params_mut());
        p
    }
}
