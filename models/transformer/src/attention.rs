//! Causal multi-head self-attention (SPEC §4.2): column-parallel `linear_qkv` → fused
//! attention on this rank's `np/tp` heads → row-parallel `linear_proj`.
//!
//! The `linear_qkv` weight rows are Megatron's fused layout `[np, 3, hn]` (per head its q, k
//! and v rows), so its output viewed as `(B, T, np/tp, 3, hn)` is exactly the layout the
//! backend's attention kernel takes; a TP shard is a contiguous range of heads.

use crate::init::ModuleBuilder;
use crate::linear::{LinearConfig, LinearLayer};
use crate::spec::{SelfAttentionSpec, SpecProvider, TransformerConfig};
use crate::step::{empty, ensure_shape, DropoutSite, ModuleScratch, StepInfo};
use anyhow::Result;
use megatron_core::{AttentionSpec, Backend, DType, DeviceTensor, KvCacheAttentionSpec, Param};
use std::sync::Arc;

pub struct SelfAttention {
    backend: Arc<dyn Backend>,
    pub linear_qkv: Box<dyn LinearLayer>,
    pub linear_proj: Box<dyn LinearLayer>,
    heads_local: usize,
    head_dim: usize,
    causal: bool,
    attention_dropout: f32,
    layer: usize,
    tp_rank: usize,
    qkv: DeviceTensor,     // (B, T, np/tp, 3, hn), kept as (B, T, 3·np/tp·hn) for the linear's row sums
    context: DeviceTensor, // (B, T, np/tp * hn)
    lse: DeviceTensor,     // (B, np/tp, T)
}

impl SelfAttention {
    /// Builds `{prefix}.linear_qkv` and `{prefix}.linear_proj` for layer `layer` (0-based).
    pub fn new(
        b: &ModuleBuilder,
        provider: &dyn SpecProvider,
        prefix: &str,
        cfg: &TransformerConfig,
        spec: SelfAttentionSpec,
        layer: usize,
    ) -> Result<SelfAttention> {
        let h = cfg.hidden_size;
        let qkv_cfg = LinearConfig {
            in_features: h,
            out_features: 3 * h,
            bias: spec.bias,
            init_std: cfg.init_method_std,
            out_chunks: 1,
        };
        let proj_cfg = LinearConfig {
            in_features: h,
            out_features: h,
            bias: spec.bias,
            init_std: cfg.output_init_std(),
            out_chunks: 1,
        };
        let backend = b.backend.clone();
        Ok(SelfAttention {
            linear_qkv: provider.column_parallel_linear(b, &format!("{prefix}.linear_qkv"), qkv_cfg)?,
            linear_proj: provider.row_parallel_linear(b, &format!("{prefix}.linear_proj"), proj_cfg)?,
            heads_local: cfg.num_attention_heads / b.tp_size(),
            head_dim: cfg.head_dim(),
            causal: spec.causal,
            attention_dropout: cfg.attention_dropout,
            layer,
            tp_rank: b.tp_rank(),
            qkv: empty(backend.as_ref())?,
            context: empty(backend.as_ref())?,
            lse: empty(backend.as_ref())?,
            backend,
        })
    }

    fn spec(&self, step: &StepInfo) -> AttentionSpec {
        AttentionSpec {
            batch: step.batch,
            seq: step.seq,
            heads: self.heads_local,
            head_dim: self.head_dim,
            causal: self.causal,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
            dropout_p: step.dropout_p(self.attention_dropout),
            dropout_seed: step.dropout_seed(self.layer, DropoutSite::AttentionProbs, self.tp_rank),
        }
    }

    /// `out (B, T, C)` = attention of `x (B, T, C)` (before the residual dropout-add).
    pub fn forward(&mut self, x: &DeviceTensor, out: &mut DeviceTensor, step: &StepInfo) -> Result<()> {
        let (b, t, np, hn) = (step.batch, step.seq, self.heads_local, self.head_dim);
        let backend = self.backend.as_ref();
        ensure_shape(backend, &mut self.qkv, &[b, t, np * 3 * hn])?;
        ensure_shape(backend, &mut self.context, &[b, t, np * hn])?;
        ensure_shape(backend, &mut self.lse, &[b, np, t])?;
        self.linear_qkv.forward(x, &mut self.qkv)?;
        let spec = self.spec(step);
        backend.attention_forward(&self.qkv, &mut self.context, &mut self.lse, spec)?;
        self.linear_proj.forward(&self.context, out)
    }

    /// Overwrites `d_x (B, T, C)` from `d_out (B, T, C)`; accumulates parameter gradients.
    pub fn backward(
        &mut self,
        x: &DeviceTensor,
        d_out: &DeviceTensor,
        d_x: &mut DeviceTensor,
        scratch: &mut ModuleScratch,
        step: &StepInfo,
    ) -> Result<()> {
        let backend = self.backend.as_ref();
        ensure_shape(backend, &mut scratch.d_context, self.context.shape())?;
        ensure_shape(backend, &mut scratch.d_qkv, self.qkv.shape())?;
        self.linear_proj.backward(&self.context, d_out, Some(&mut scratch.d_context))?;
        let spec = self.spec(step);
        backend.attention_backward(
            &scratch.d_context,
            &self.qkv,
            &self.context,
            &self.lse,
            &mut scratch.d_qkv,
            spec,
        )?;
        self.linear_qkv.backward(x, &scratch.d_qkv, Some(d_x))
    }

    /// The `qkv (B, T, 3C/tp)`, `context (B, T, C/tp)` and `lse (B, np/tp, T)` of the last
    /// forward (and whatever the linears keep), see [`crate::step::SavedActivations`].
    pub fn saved_activations_mut(&mut self) -> Vec<&mut DeviceTensor> {
        let mut v = vec![&mut self.qkv, &mut self.context, &mut self.lse];
        v.extend(self.linear_qkv.saved_activations_mut());
        v.extend(self.linear_proj.saved_activations_mut());
        v
    }

    /// An empty key/value cache of this layer's heads for `batch` rows of up to `capacity`
    /// tokens (inference only).
    pub fn new_kv_cache(&self, batch: usize, capacity: usize) -> Result<LayerKvCache> {
        let shape = [batch, capacity, self.heads_local, self.head_dim];
        let backend = self.backend.as_ref();
        Ok(LayerKvCache { k: backend.zeros(&shape, DType::F32)?, v: backend.zeros(&shape, DType::F32)? })
    }

    /// Inference forward of `step.seq` new tokens per row, `x (B, Tq, C)` → `out (B, Tq, C)`:
    /// their k/v are appended to `cache` at `offset` and each query attends causally to the
    /// cached keys from `key_start[b]` on (see [`KvCacheAttentionSpec`]). No dropout, nothing
    /// saved for backward.
    pub fn forward_cached(
        &mut self,
        x: &DeviceTensor,
        out: &mut DeviceTensor,
        cache: &mut LayerKvCache,
        offset: usize,
        key_start: Option<&DeviceTensor>,
        step: &StepInfo,
    ) -> Result<()> {
        let (b, t, np, hn) = (step.batch, step.seq, self.heads_local, self.head_dim);
        let backend = self.backend.as_ref();
        ensure_shape(backend, &mut self.qkv, &[b, t, np * 3 * hn])?;
        ensure_shape(backend, &mut self.context, &[b, t, np * hn])?;
        self.linear_qkv.forward(x, &mut self.qkv)?;
        let spec = KvCacheAttentionSpec {
            batch: b,
            new_tokens: t,
            heads: np,
            head_dim: hn,
            capacity: cache.capacity(),
            offset,
            scale: 1.0 / (hn as f32).sqrt(),
        };
        backend.attention_kv_cache(&self.qkv, &mut cache.k, &mut cache.v, key_start, &mut self.context, spec)?;
        self.linear_proj.forward(&self.context, out)
    }

    pub fn params(&self) -> Vec<&Param> {
        self.linear_qkv.params().into_iter().chain(self.linear_proj.params()).collect()
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        self.linear_qkv.params_mut().into_iter().chain(self.linear_proj.params_mut()).collect()
    }
}

/// One layer's key/value cache for incremental decoding: `k`, `v` are
/// `(B, capacity, heads/tp, head_dim)`; positions past the caller's offset are unused.
pub struct LayerKvCache {
    pub k: DeviceTensor,
    pub v: DeviceTensor,
}

impl LayerKvCache {
    /// Tokens per row the cache can hold.
    pub fn capacity(&self) -> usize {
        self.k.shape().get(1).copied().unwrap_or(0)
    }
}
