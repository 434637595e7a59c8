//! T5 attention modules on the cross-attention op: the self-attention of the encoder (padding
//! mask) and decoder (causal + padding), both with an optional relative position bias, and the
//! decoder's cross-attention to the encoder output. Megatron-Core's parameter names: a fused
//! column-parallel `linear_qkv` `[np·3·hn, h]` (per head q, k, v) for self-attention,
//! `linear_q` `[np·hn, h]` and `linear_kv` `[np·2·hn, h]` (per head k, v) for
//! cross-attention, a row-parallel `linear_proj` `[h, np·hn]`. Heads are split over TP.

use crate::host::{as_dtype, merge_qkv, split_qkv};
use anyhow::Result;
use megatron_core::{Backend, CrossAttentionSpec, DType, DeviceTensor, HostBuffer, Param};
use megatron_transformer::step::{empty, ensure_shape};
use megatron_transformer::{
    ColumnParallelLinear, DropoutSite, LinearConfig, LinearLayer, ModuleBuilder, RowParallelLinear, StepInfo,
};
use std::sync::Arc;

/// Sizes shared by the attention modules of one model.
#[derive(Clone, Copy, Debug)]
pub struct AttnDims {
    pub hidden: usize,
    /// Global heads `np` and head size `hn`.
    pub heads: usize,
    pub head_dim: usize,
    pub bias: bool,
    pub scale: f32,
    /// Attention-probability dropout (`--attention-dropout`).
    pub dropout: f32,
    pub init_std: f32,
    pub output_init_std: f32,
}

/// What a forward call attends with (`None`: no padding / no bias).
#[derive(Clone, Copy)]
pub struct AttnInputs<'a> {
    pub batch: usize,
    pub q_len: usize,
    pub kv_len: usize,
    pub q_valid: Option<&'a DeviceTensor>,
    pub kv_valid: Option<&'a DeviceTensor>,
    pub bias: Option<&'a DeviceTensor>,
}

enum Proj {
    /// Self-attention: fused QKV.
    Qkv(Box<ColumnParallelLinear>),
    /// Cross-attention: queries from the decoder, keys/values from the encoder output.
    QKv(Box<(ColumnParallelLinear, ColumnParallelLinear)>),
}

pub struct T5Attention {
    backend: Arc<dyn Backend>,
    proj: Proj,
    pub linear_proj: RowParallelLinear,
    causal: bool,
    /// Local heads (`np / tp`).
    heads: usize,
    hd: usize,
    scale: f32,
    dropout: f32,
    /// Dropout-seed id of this module.
    id: usize,
    tp_rank: usize,
    /// Activation dtype (the model's parameter dtype). The attention core (`q`, `kv`, `ctx`,
    /// `lse`) runs in fp32 on the half-rounded projections (the CPU cross-attention op is fp32
    /// only; scores and softmax are fp32 in any case).
    dtype: DType,
    q: DeviceTensor,        // (B*Tq, heads*hd): (B, Tq, heads, hd)
    kv: DeviceTensor,       // (B*Tk, heads*2*hd): (B, Tk, heads, 2, hd)
    ctx: DeviceTensor,      // (B, Tq, heads*hd): attention output, input of linear_proj
    lse: DeviceTensor,      // (B, heads, Tq)
    ctx_half: DeviceTensor, // (B, Tq, heads*hd) in `dtype`: linear_proj's input in a half model
    spec: Option<CrossAttentionSpec>,
}

impl T5Attention {
    /// `{prefix}.linear_qkv`, `{prefix}.linear_proj` (self) or `{prefix}.linear_q`,
    /// `{prefix}.linear_kv`, `{prefix}.linear_proj` (cross).
    pub fn new(
        b: &ModuleBuilder,
        prefix: &str,
        d: AttnDims,
        cross: bool,
        causal: bool,
        id: usize,
    ) -> Result<T5Attention> {
        let lin = |name: &str, out: usize| {
            let cfg = LinearConfig {
                in_features: d.hidden,
                out_features: out,
                bias: d.bias,
                init_std: d.init_std,
                out_chunks: 1,
            };
            ColumnParallelLinear::new(b, &format!("{prefix}.{name}"), cfg)
        };
        let (np, hn) = (d.heads, d.head_dim);
        let proj = if cross {
            Proj::QKv(Box::new((lin("linear_q", np * hn)?, lin("linear_kv", np * 2 * hn)?)))
        } else {
            Proj::Qkv(Box::new(lin("linear_qkv", np * 3 * hn)?))
        };
        let pcfg = LinearConfig {
            in_features: np * hn,
            out_features: d.hidden,
            bias: d.bias,
            init_std: d.output_init_std,
            out_chunks: 1,
        };
        let be = b.backend.clone();
        Ok(T5Attention {
            proj,
            linear_proj: RowParallelLinear::new(b, &format!("{prefix}.linear_proj"), pcfg)?,
            causal,
            heads: np / b.tp_size(),
            hd: hn,
            scale: d.scale,
            dropout: d.dropout,
            id,
            tp_rank: b.tp_rank(),
            dtype: b.precision.params,
            ctx_half: empty(be.as_ref())?,
            q: empty(be.as_ref())?,
            kv: empty(be.as_ref())?,
            ctx: empty(be.as_ref())?,
            lse: empty(be.as_ref())?,
            spec: None,
            backend: be,
        })
    }

    /// `out (B, Tq, C)` from `x (B, Tq, C)` (and `memory (B, Tk, C)` for cross-attention).
    pub fn forward(
        &mut self,
        x: &DeviceTensor,
        memory: Option<&DeviceTensor>,
        a: AttnInputs,
        out: &mut DeviceTensor,
        step: &StepInfo,
    ) -> Result<()> {
        let be = self.backend.as_ref();
        let (h, hd) = (self.heads, self.hd);
        match &mut self.proj {
            Proj::Qkv(qkv) => {
                let mut fused = be.zeros(&[a.batch * a.q_len, h * 3 * hd], self.dtype)?;
                qkv.forward(x, &mut fused)?;
                (self.q, self.kv) = split_qkv(be, &fused, a.batch * a.q_len, h, hd)?;
            }
            Proj::QKv(pair) => {
                let (lq, lkv) = &mut **pair;
                let memory = memory.ok_or_else(|| anyhow::anyhow!("t5 cross-attention needs the encoder output"))?;
                if self.dtype == DType::F32 {
                    ensure_shape(be, &mut self.q, &[a.batch * a.q_len, h * hd])?;
                    ensure_shape(be, &mut self.kv, &[a.batch * a.kv_len, h * 2 * hd])?;
                    lq.forward(x, &mut self.q)?;
                    lkv.forward(memory, &mut self.kv)?;
                } else {
                    // Projections rounded to the half dtype, widened for the fp32 core.
                    let mut q = be.zeros(&[a.batch * a.q_len, h * hd], self.dtype)?;
                    let mut kv = be.zeros(&[a.batch * a.kv_len, h * 2 * hd], self.dtype)?;
                    lq.forward(x, &mut q)?;
                    lkv.forward(memory, &mut kv)?;
                    (self.q, self.kv) = (as_dtype(be, q, DType::F32)?, as_dtype(be, kv, DType::F32)?);
                }
            }
        }
        let spec = CrossAttentionSpec {
            batch: a.batch,
            q_len: a.q_len,
            kv_len: a.kv_len,
            heads: h,
            head_dim: hd,
            causal: self.causal,
            scale: self.scale,
            dropout_p: step.dropout_p(self.dropout),
            dropout_seed: step.dropout_seed(self.id, DropoutSite::AttentionProbs, self.tp_rank),
        };
        ensure_shape(be, &mut self.ctx, &[a.batch, a.q_len, h * hd])?;
        ensure_shape(be, &mut self.lse, &[spec.lse_numel()])?;
        be.cross_attention_forward(
            &self.q,
            &self.kv,
            a.q_valid,
            a.kv_valid,
            a.bias,
            &mut self.ctx,
            &mut self.lse,
            spec,
        )?;
        self.spec = Some(spec);
        if self.dtype == DType::F32 {
            return self.linear_proj.forward(&self.ctx, out);
        }
        self.ctx_half = be.zeros(self.ctx.shape(), self.dtype)?;
        be.cast(&self.ctx, &mut self.ctx_half)?;
        self.linear_proj.forward(&self.ctx_half, out)
    }

    /// Overwrites `d_x`; adds the memory gradient into `d_memory` (cross-attention) and the
    /// bias gradient into `d_bias` (when given); accumulates parameter gradients.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &mut self,
        x: &DeviceTensor,
        memory: Option<&DeviceTensor>,
        a: AttnInputs,
        d_out: &DeviceTensor,
        d_x: &mut DeviceTensor,
        d_memory: Option<&mut DeviceTensor>,
        d_bias: Option<&mut DeviceTensor>,
    ) -> Result<()> {
        let be = self.backend.as_ref();
        let spec = self.spec.ok_or_else(|| anyhow::anyhow!("t5 attention backward without a training forward"))?;
        let half = self.dtype != DType::F32;
        let mut d_ctx = be.zeros(self.ctx.shape(), self.dtype)?;
        self.linear_proj.backward(if half { &self.ctx_half } else { &self.ctx }, d_out, Some(&mut d_ctx))?;
        let d_ctx = as_dtype(be, d_ctx, DType::F32)?;
        let mut dq = be.zeros(self.q.shape(), megatron_core::DType::F32)?;
        let mut dkv = be.zeros(self.kv.shape(), megatron_core::DType::F32)?;
        be.cross_attention_backward(
            &d_ctx, &self.q, &self.kv, a.q_valid, a.kv_valid, a.bias, &self.ctx, &self.lse, &mut dq, &mut dkv, d_bias,
            spec,
        )?;
        match &mut self.proj {
            Proj::Qkv(qkv) => {
                let mut d_fused =
                    be.zeros(&[a.batch * a.q_len, self.heads * 3 * self.hd], megatron_core::DType::F32)?;
                merge_qkv(be, &dq, &dkv, self.hd, &mut d_fused)?;
                let d_fused = as_dtype(be, d_fused, self.dtype)?;
                qkv.backward(x, &d_fused, Some(d_x))
            }
            Proj::QKv(pair) => {
                let (lq, lkv) = &mut **pair;
                lq.backward(x, &as_dtype(be, dq, self.dtype)?, Some(d_x))?;
                let memory =
                    memory.ok_or_else(|| anyhow::anyhow!("t5 cross-attention backward needs the encoder output"))?;
                let mut d_mem = be.zeros(memory.shape(), self.dtype)?;
                lkv.backward(memory, &as_dtype(be, dkv, self.dtype)?, Some(&mut d_mem))?;
                match d_memory {
                    Some(acc) => be.axpy(acc, 1.0, &d_mem),
                    None => Ok(()),
                }
            }
        }
    }

    /// Incremental decoding (inference, batch 1): the self-attention of the newest decoder
    /// position. `x (1, C)` is its normed input; its key/value row `(heads, 2, hd)` is appended
    /// to `kv_cache` (host, `(t, heads, 2, hd)` for the `t` positions so far) and its query
    /// attends to all `t + 1` keys with `bias (heads, 1, t + 1)` (the causal mask is implied:
    /// only earlier keys are in the cache). `out (1, C)`.
    pub fn decode_self(
        &mut self,
        x: &DeviceTensor,
        kv_cache: &mut Vec<f32>,
        bias: Option<&DeviceTensor>,
        out: &mut DeviceTensor,
    ) -> Result<()> {
        let be = self.backend.clone();
        let be = be.as_ref();
        let (h, hd) = (self.heads, self.hd);
        let Proj::Qkv(qkv) = &mut self.proj else { anyhow::bail!("t5 decode_self called on a cross-attention module") };
        let mut fused = be.zeros(&[1, h * 3 * hd], megatron_core::DType::F32)?; // (1, heads, 3, hd)
        qkv.forward(x, &mut fused)?;
        let fused = be.to_host(&fused)?.to_f32_vec();
        let mut q = Vec::with_capacity(h * hd);
        for blk in fused.chunks_exact(3 * hd) {
            q.extend_from_slice(&blk[..hd]);
            kv_cache.extend_from_slice(&blk[hd..]);
        }
        let keys = kv_cache.len() / (h * 2 * hd);
        let q = be.from_host(HostBuffer::F32(q), &[1, h * hd])?; // (1, 1, heads, hd)
        let kv = be.from_host(HostBuffer::F32(kv_cache.clone()), &[keys, h * 2 * hd])?; // (1, t+1, heads, 2, hd)
        self.attend(&q, &kv, None, bias, 1, keys, out)
    }

    /// The cross-attention keys/values of the encoder output `memory (Tk, C)`: `(Tk, heads, 2,
    /// hd)`, computed once per generated sequence and layer.
    pub fn cross_kv(&mut self, memory: &DeviceTensor) -> Result<DeviceTensor> {
        let be = self.backend.clone();
        let Proj::QKv(pair) = &mut self.proj else { anyhow::bail!("t5 cross_kv called on a self-attention module") };
        let mut kv = be.zeros(&[memory.shape()[0], self.heads * 2 * self.hd], megatron_core::DType::F32)?;
        pair.1.forward(memory, &mut kv)?;
        Ok(kv)
    }

    /// Incremental decoding: the cross-attention of the newest decoder position `x (1, C)` to
    /// the cached `kv (Tk, heads, 2, hd)` of [`Self::cross_kv`], keys `j < kv_valid[0]`.
    pub fn decode_cross(
        &mut self,
        x: &DeviceTensor,
        kv: &DeviceTensor,
        kv_valid: &DeviceTensor,
        out: &mut DeviceTensor,
    ) -> Result<()> {
        let be = self.backend.clone();
        let Proj::QKv(pair) = &mut self.proj else {
            anyhow::bail!("t5 decode_cross called on a self-attention module")
        };
        let mut q = be.zeros(&[1, self.heads * self.hd], megatron_core::DType::F32)?; // (1, 1, heads, hd)
        pair.0.forward(x, &mut q)?;
        let tk = kv.shape()[0];
        self.attend(&q, kv, Some(kv_valid), None, 1, tk, out)
    }

    /// Inference attention of `q (1, tq, heads, hd)` to `kv (1, tk, heads, 2, hd)`, then `linear_proj`.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &mut self,
        q: &DeviceTensor,
        kv: &DeviceTensor,
        kv_valid: Option<&DeviceTensor>,
        bias: Option<&DeviceTensor>,
        tq: usize,
        tk: usize,
        out: &mut DeviceTensor,
    ) -> Result<()> {
        let be = self.backend.clone();
        let be = be.as_ref();
        let spec = CrossAttentionSpec {
            batch: 1,
            q_len: tq,
            kv_len: tk,
            heads: self.heads,
            head_dim: self.hd,
            causal: false,
            scale: self.scale,
            dropout_p: 0.0,
            dropout_seed: 0,
        };
        let mut ctx = be.zeros(&[1, tq, self.heads * self.hd], megatron_core::DType::F32)?;
        let mut lse = be.zeros(&[spec.lse_numel()], megatron_core::DType::F32)?;
        be.cross_attention_forward(q, kv, None, kv_valid, bias, &mut ctx, &mut lse, spec)?;
        self.linear_proj.forward(&ctx, out)
    }

    /// Frees what backward needs (full recomputation re-runs [`Self::forward`]).
    pub fn drop_saved(&mut self) -> Result<()> {
        let be = self.backend.as_ref();
        (self.q, self.kv, self.ctx, self.lse, self.ctx_half) =
            (empty(be)?, empty(be)?, empty(be)?, empty(be)?, empty(be)?);
        self.spec = None;
        Ok(())
    }

    pub fn params(&self) -> Vec<&Param> {
        let mut v: Vec<&Param> = match &self.proj {
            Proj::Qkv(l) => l.params(),
            Proj::QKv(pair) => pair.0.params().into_iter().chain(pair.1.params()).collect(),
        };
        v.extend(self.linear_proj.params());
        v
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut v: Vec<&mut Param> = match &mut self.proj {
            Proj::Qkv(l) => l.params_mut(),
            Proj::QKv(pair) => {
                let (q, kv) = &mut **pair;
                q.params_mut().into_iter().chain(kv.params_mut()).collect()
            }
        };
        v.extend(self.linear_proj.params_mut());
        v
    }
}
