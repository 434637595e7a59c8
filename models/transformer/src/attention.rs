//! Causal self-attention (SPEC §4.2): column-parallel `linear_qkv` → (grouped-query relayout)
//! → (rotary) → fused attention on this rank's `np/tp` heads → row-parallel `linear_proj`.
//!
//! The `linear_qkv` weight rows are Megatron's fused layout `[ng, r + 2, hn]` (per query group
//! its `r = np/ng` query heads, then the group's key and value; `r = 1` without GQA, which is
//! `[np, 3, hn]`). A TP shard is a contiguous range of groups. Without GQA the output viewed
//! as `(B, T, np/tp, 3, hn)` is exactly the backend attention's layout; with GQA it is first
//! expanded to that layout (every head gets its group's k/v) and the backward sums the heads'
//! k/v gradients back into their group (`Backend::gqa_expand`/`gqa_reduce`).
//!
//! Rotary embeddings (`--position-embedding-type rope`) rotate q and k of the per-head tensor
//! in place after the relayout; the backward applies the inverse rotation (the transpose) to
//! the q/k gradients before the relayout's backward. `--qk-layernorm` normalizes every head's
//! q and k before the rotation ([`crate::qk_norm`]).

use crate::context_parallel::{ring_attention_backward, ring_attention_forward, rotary_context_parallel_scaled};
use crate::init::ModuleBuilder;
use crate::linear::{LinearConfig, LinearLayer};
use crate::qk_norm::QkNorm;
use crate::spec::{RotaryConfig, SelfAttentionSpec, SpecProvider, TransformerConfig};
use crate::step::{empty, ensure_buffer, ensure_shape, DropoutSite, ModuleScratch, StepInfo};
use anyhow::Result;
use megatron_core::{AttentionSpec, Backend, DType, DeviceTensor, GqaSpec, KvCacheAttentionSpec, Param, RotarySpec};
use std::sync::Arc;

pub struct SelfAttention {
    backend: Arc<dyn Backend>,
    pub linear_qkv: Box<dyn LinearLayer>,
    pub linear_proj: Box<dyn LinearLayer>,
    heads_local: usize,
    groups_local: usize,
    head_dim: usize,
    rotary: Option<RotaryConfig>,
    /// `--qk-layernorm`: per-head norms of q and k before the rotation.
    pub qk_norm: Option<QkNorm>,
    causal: bool,
    attention_dropout: f32,
    layer: usize,
    tp_rank: usize,
    /// dtype of the activations (the builder's parameter dtype); `lse` stays fp32.
    act: DType,
    /// The context when `--context-parallel-size` > 1: the core attention is the ring of
    /// [`crate::context_parallel`] over the CP group instead of the backend's local kernel.
    context_parallel: Option<megatron_core::ParallelContext>,
    qkv_grouped: DeviceTensor, // GQA only: (B, T, ng/tp, r+2, hn), not needed by backward
    qkv: DeviceTensor,         // (B, T, np/tp, 3, hn) rotated, kept as (B, T, 3·np/tp·hn)
    context: DeviceTensor,     // (B, T, np/tp * hn)
    lse: DeviceTensor,         // (B, np/tp, T)
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
        let (np, ng, hn) = (cfg.num_attention_heads, cfg.query_groups(), cfg.head_dim());
        let qkv_cfg = LinearConfig {
            in_features: h,
            out_features: (np + 2 * ng) * hn,
            bias: spec.bias || spec.qkv_bias,
            init_std: cfg.init_method_std,
            out_chunks: 1,
        };
        let proj_cfg = LinearConfig {
            in_features: np * hn,
            out_features: h,
            bias: spec.bias,
            init_std: cfg.output_init_std(),
            out_chunks: 1,
        };
        let backend = b.backend.clone();
        let bk = backend.as_ref();
        let context_parallel = (b.ctx.grid.cp > 1).then(|| b.ctx.clone());
        Ok(SelfAttention {
            context_parallel,
            linear_qkv: provider.column_parallel_linear(b, &format!("{prefix}.linear_qkv"), qkv_cfg)?,
            linear_proj: provider.row_parallel_linear(b, &format!("{prefix}.linear_proj"), proj_cfg)?,
            heads_local: np / b.tp_size(),
            groups_local: ng / b.tp_size(),
            head_dim: hn,
            rotary: cfg.rotary,
            qk_norm: match cfg.qk_layernorm {
                Some(kind) => Some(QkNorm::new(b, provider, prefix, kind, hn, cfg.layernorm_epsilon)?),
                None => None,
            },
            causal: spec.causal,
            attention_dropout: cfg.attention_dropout,
            layer,
            tp_rank: b.tp_rank(),
            act: b.dtype(),
            qkv_grouped: empty(bk)?,
            qkv: empty(bk)?,
            context: empty(bk)?,
            lse: empty(bk)?,
            backend,
        })
    }

    fn is_gqa(&self) -> bool {
        self.groups_local != self.heads_local
    }

    fn gqa_spec(&self, rows: usize) -> GqaSpec {
        GqaSpec {
            rows,
            groups: self.groups_local,
            heads_per_group: self.heads_local / self.groups_local,
            head_dim: self.head_dim,
        }
    }

    fn rotary_spec(&self, batch: usize, seq: usize, offset: usize) -> Option<RotarySpec> {
        self.rotary.map(|r| RotarySpec {
            batch,
            seq,
            heads: self.heads_local,
            head_dim: self.head_dim,
            rotary_dim: (self.head_dim as f32 * r.percent) as usize,
            base: r.base,
            interleaved: r.interleaved,
            position_offset: offset,
        })
    }

    /// The rotary frequency scaling (`RopeScaling::None` without rotary or scaling).
    fn rope_scaling(&self) -> megatron_core::RopeScaling {
        self.rotary.map(|r| r.scaling).unwrap_or_default()
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

    /// `self.qkv (B, T, np/tp, 3, hn)` from `x (B, T, C)`: linear, GQA expansion, rotation of
    /// q and k at positions `offset + t`.
    fn project_qkv(&mut self, x: &DeviceTensor, b: usize, t: usize, offset: usize) -> Result<()> {
        let (np, ng, hn) = (self.heads_local, self.groups_local, self.head_dim);
        let backend = self.backend.clone();
        let bk = backend.as_ref();
        ensure_buffer(bk, &mut self.qkv, &[b, t, np * 3 * hn], self.act)?;
        if self.is_gqa() {
            ensure_buffer(bk, &mut self.qkv_grouped, &[b, t, (np + 2 * ng) * hn], self.act)?;
            self.linear_qkv.forward(x, &mut self.qkv_grouped)?;
            let spec = self.gqa_spec(b * t);
            bk.gqa_expand(&self.qkv_grouped, &mut self.qkv, spec)?;
        } else {
            self.linear_qkv.forward(x, &mut self.qkv)?;
        }
        if let Some(norm) = &mut self.qk_norm {
            norm.forward(bk, &mut self.qkv, hn)?;
        }
        if let Some(spec) = self.rotary_spec(b, t, offset) {
            let scaling = self.rope_scaling();
            match &self.context_parallel {
                Some(ctx) => rotary_context_parallel_scaled(bk, ctx, &mut self.qkv, spec, scaling, false)?,
                None => bk.rotary_scaled(&mut self.qkv, spec, scaling, false)?,
            }
        }
        Ok(())
    }

    /// `out (B, T, C)` = attention of `x (B, T, C)` (before the residual dropout-add).
    pub fn forward(&mut self, x: &DeviceTensor, out: &mut DeviceTensor, step: &StepInfo) -> Result<()> {
        let (b, t, np, hn) = (step.batch, step.seq, self.heads_local, self.head_dim);
        self.project_qkv(x, b, t, 0)?;
        let backend = self.backend.as_ref();
        ensure_buffer(backend, &mut self.context, &[b, t, np * hn], self.act)?;
        ensure_shape(backend, &mut self.lse, &[b, np, t])?;
        let spec = self.spec(step);
        match &self.context_parallel {
            Some(ctx) => ring_attention_forward(backend, ctx, &self.qkv, &mut self.context, &mut self.lse, spec)?,
            None => backend.attention_forward(&self.qkv, &mut self.context, &mut self.lse, spec)?,
        }
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
        let gqa = self.is_gqa();
        ensure_buffer(backend, &mut scratch.d_context, self.context.shape(), self.act)?;
        self.linear_proj.backward(&self.context, d_out, Some(&mut scratch.d_context))?;
        let spec = self.spec(step);
        // d of the per-head (rotated) qkv: straight into d_qkv without GQA.
        let d_heads = if gqa { &mut scratch.d_qkv_heads } else { &mut scratch.d_qkv };
        ensure_buffer(backend, d_heads, self.qkv.shape(), self.qkv.dtype())?;
        match &self.context_parallel {
            Some(ctx) => ring_attention_backward(
                backend,
                ctx,
                &scratch.d_context,
                &self.qkv,
                &self.context,
                &self.lse,
                d_heads,
                spec,
            )?,
            None => {
                backend.attention_backward(&scratch.d_context, &self.qkv, &self.context, &self.lse, d_heads, spec)?
            }
        }
        if let Some(rs) = self.rotary_spec(step.batch, step.seq, 0) {
            // The rotation is orthogonal: its backward is the inverse rotation.
            let scaling = self.rope_scaling();
            match &self.context_parallel {
                Some(ctx) => rotary_context_parallel_scaled(backend, ctx, d_heads, rs, scaling, true)?,
                None => backend.rotary_scaled(d_heads, rs, scaling, true)?,
            }
        }
        if let Some(norm) = &mut self.qk_norm {
            norm.backward(backend, d_heads, self.head_dim)?;
        }
        if gqa {
            let (np, ng, hn) = (self.heads_local, self.groups_local, self.head_dim);
            ensure_buffer(backend, &mut scratch.d_qkv, &[step.batch, step.seq, (np + 2 * ng) * hn], self.act)?;
            backend.gqa_reduce(&scratch.d_qkv_heads, &mut scratch.d_qkv, self.gqa_spec(step.tokens()))?;
        }
        self.linear_qkv.backward(x, &scratch.d_qkv, Some(d_x))
    }

    /// The `qkv (B, T, 3C/tp)`, `context (B, T, C/tp)` and `lse (B, np/tp, T)` of the last
    /// forward (and whatever the linears keep), see [`crate::step::SavedActivations`].
    pub fn saved_activations_mut(&mut self) -> Vec<&mut DeviceTensor> {
        let mut v = vec![&mut self.qkv, &mut self.context, &mut self.lse];
        if let Some(norm) = &mut self.qk_norm {
            v.extend(norm.saved_activations_mut());
        }
        v.extend(self.linear_qkv.saved_activations_mut());
        v.extend(self.linear_proj.saved_activations_mut());
        v
    }

    /// An empty key/value cache of this layer's heads for `batch` rows of up to `capacity`
    /// tokens (inference only). With GQA every head keeps its group's k/v (the backend's
    /// cached attention is per head).
    pub fn new_kv_cache(&self, batch: usize, capacity: usize) -> Result<LayerKvCache> {
        let shape = [batch, capacity, self.heads_local, self.head_dim];
        let backend = self.backend.as_ref();
        Ok(LayerKvCache { k: backend.zeros(&shape, DType::F32)?, v: backend.zeros(&shape, DType::F32)? })
    }

    /// Inference forward of `step.seq` new tokens per row, `x (B, Tq, C)` → `out (B, Tq, C)`:
    /// their k/v are appended to `cache` at `offset` and each query attends causally to the
    /// cached keys from `key_start[b]` on (see [`KvCacheAttentionSpec`]). No dropout, nothing
    /// saved for backward. Rotary positions are `offset + t`.
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
        self.project_qkv(x, b, t, offset)?;
        let backend = self.backend.as_ref();
        ensure_buffer(backend, &mut self.context, &[b, t, np * hn], self.act)?;
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

    /// Continuous batching: like [`Self::forward_cached`], but row `r` of `x (B, Tq, C)` is
    /// slot `slots[r]` of `cache` (allocated with one row per slot) with `offsets[r]` tokens
    /// already cached (see `Backend::attention_kv_cache_slots`). Rotary positions are
    /// `offsets[r] + t`, so with rotary embeddings all rows of one call must share the offset.
    pub fn forward_slots(
        &mut self,
        x: &DeviceTensor,
        out: &mut DeviceTensor,
        cache: &mut LayerKvCache,
        slots: &[usize],
        offsets: &[usize],
        step: &StepInfo,
    ) -> Result<()> {
        let (b, t, np, hn) = (step.batch, step.seq, self.heads_local, self.head_dim);
        let offset = offsets.first().copied().unwrap_or(0);
        if self.rotary.is_some() && offsets.iter().any(|&o| o != offset) {
            anyhow::bail!("slotted decoding with rotary embeddings needs one offset per call (got {offsets:?})");
        }
        self.project_qkv(x, b, t, offset)?;
        let backend = self.backend.as_ref();
        ensure_buffer(backend, &mut self.context, &[b, t, np * hn], self.act)?;
        let spec = KvCacheAttentionSpec {
            batch: b,
            new_tokens: t,
            heads: np,
            head_dim: hn,
            capacity: cache.capacity(),
            offset: 0,
            scale: 1.0 / (hn as f32).sqrt(),
        };
        backend.attention_kv_cache_slots(
            &self.qkv,
            &mut cache.k,
            &mut cache.v,
            slots,
            offsets,
            &mut self.context,
            spec,
        )?;
        self.linear_proj.forward(&self.context, out)
    }

    pub fn params(&self) -> Vec<&Param> {
        let norms = self.qk_norm.iter().flat_map(|n| n.params());
        self.linear_qkv.params().into_iter().chain(self.linear_proj.params()).chain(norms).collect()
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        let norms = self.qk_norm.iter_mut().flat_map(|n| n.params_mut());
        self.linear_qkv.params_mut().into_iter().chain(self.linear_proj.params_mut()).chain(norms).collect()
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
