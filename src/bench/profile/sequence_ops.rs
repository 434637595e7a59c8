//! The forwarders of [`ProfilingBackend`] for attention (all its variants), rotary positions and
//! the Mamba-2 mixer, each op timed under its name (see `ops.rs`).

use super::{ProfilingBackend, T};
use megatron_core::{
    AttentionOps, AttentionSpec, KvCacheAttentionSpec, KvCacheOps, MambaOps, PaddedAttentionOps, Result,
    RingAttentionOps, RotaryOps, RotarySpec,
};

impl AttentionOps for ProfilingBackend {
    fn attention_forward(&self, qkv: &T, out: &mut T, lse: &mut T, spec: AttentionSpec) -> Result<()> {
        self.timed("attention_forward", |b| b.attention_forward(qkv, out, lse, spec))
    }
    fn attention_backward(
        &self,
        d_out: &T,
        qkv: &T,
        out: &T,
        lse: &T,
        d_qkv: &mut T,
        spec: AttentionSpec,
    ) -> Result<()> {
        self.timed("attention_backward", |b| b.attention_backward(d_out, qkv, out, lse, d_qkv, spec))
    }
    fn gqa_expand(&self, src: &T, dst: &mut T, spec: megatron_core::GqaSpec) -> Result<()> {
        self.timed("gqa_expand", |b| b.gqa_expand(src, dst, spec))
    }
    fn gqa_reduce(&self, d_dst: &T, d_src: &mut T, spec: megatron_core::GqaSpec) -> Result<()> {
        self.timed("gqa_reduce", |b| b.gqa_reduce(d_dst, d_src, spec))
    }
}

impl RotaryOps for ProfilingBackend {
    fn rotary(&self, qkv: &mut T, spec: RotarySpec, inverse: bool) -> Result<()> {
        self.timed("rotary", |b| b.rotary(qkv, spec, inverse))
    }
    fn rotary_scaled(
        &self,
        qkv: &mut T,
        spec: RotarySpec,
        scaling: megatron_core::RopeScaling,
        inverse: bool,
    ) -> Result<()> {
        self.timed("rotary_scaled", |b| b.rotary_scaled(qkv, spec, scaling, inverse))
    }
}

impl KvCacheOps for ProfilingBackend {
    fn attention_kv_cache(
        &self,
        qkv: &T,
        k_cache: &mut T,
        v_cache: &mut T,
        key_start: Option<&T>,
        out: &mut T,
        spec: KvCacheAttentionSpec,
    ) -> Result<()> {
        self.timed("attention_kv_cache", |b| b.attention_kv_cache(qkv, k_cache, v_cache, key_start, out, spec))
    }
    fn attention_kv_cache_slots(
        &self,
        qkv: &T,
        k_cache: &mut T,
        v_cache: &mut T,
        slots: &[usize],
        offsets: &[usize],
        out: &mut T,
        spec: KvCacheAttentionSpec,
    ) -> Result<()> {
        self.timed("attention_kv_cache_slots", |b| {
            b.attention_kv_cache_slots(qkv, k_cache, v_cache, slots, offsets, out, spec)
        })
    }
}

impl PaddedAttentionOps for ProfilingBackend {
    #[allow(clippy::too_many_arguments)]
    fn cross_attention_forward(
        &self,
        q: &T,
        kv: &T,
        q_valid: Option<&T>,
        kv_valid: Option<&T>,
        bias: Option<&T>,
        out: &mut T,
        lse: &mut T,
        spec: megatron_core::CrossAttentionSpec,
    ) -> Result<()> {
        self.timed("cross_attention_forward", |b| {
            b.cross_attention_forward(q, kv, q_valid, kv_valid, bias, out, lse, spec)
        })
    }
    #[allow(clippy::too_many_arguments)]
    fn cross_attention_backward(
        &self,
        d_out: &T,
        q: &T,
        kv: &T,
        q_valid: Option<&T>,
        kv_valid: Option<&T>,
        bias: Option<&T>,
        out: &T,
        lse: &T,
        d_q: &mut T,
        d_kv: &mut T,
        d_bias: Option<&mut T>,
        spec: megatron_core::CrossAttentionSpec,
    ) -> Result<()> {
        self.timed("cross_attention_backward", |b| {
            b.cross_attention_backward(d_out, q, kv, q_valid, kv_valid, bias, out, lse, d_q, d_kv, d_bias, spec)
        })
    }
    fn attention_padded_forward(
        &self,
        qkv: &T,
        lengths: &T,
        out: &mut T,
        lse: &mut T,
        spec: megatron_core::PaddedAttentionSpec,
    ) -> Result<()> {
        self.timed("attention_padded_forward", |b| b.attention_padded_forward(qkv, lengths, out, lse, spec))
    }
    #[allow(clippy::too_many_arguments)]
    fn attention_padded_backward(
        &self,
        d_out: &T,
        qkv: &T,
        lengths: &T,
        out: &T,
        lse: &T,
        d_qkv: &mut T,
        spec: megatron_core::PaddedAttentionSpec,
    ) -> Result<()> {
        self.timed("attention_padded_backward", |b| {
            b.attention_padded_backward(d_out, qkv, lengths, out, lse, d_qkv, spec)
        })
    }
}

impl MambaOps for ProfilingBackend {
    fn causal_conv1d_silu_forward(
        &self,
        x: &T,
        weight: &T,
        bias: &T,
        out: &mut T,
        pre: &mut T,
        spec: megatron_core::Conv1dSpec,
    ) -> Result<()> {
        self.timed("causal_conv1d_silu_forward", |b| b.causal_conv1d_silu_forward(x, weight, bias, out, pre, spec))
    }
    #[allow(clippy::too_many_arguments)]
    fn causal_conv1d_silu_backward(
        &self,
        x: &T,
        weight: &T,
        pre: &T,
        d_out: &T,
        d_x: &mut T,
        d_weight: &mut T,
        d_bias: &mut T,
        spec: megatron_core::Conv1dSpec,
    ) -> Result<()> {
        self.timed("causal_conv1d_silu_backward", |b| {
            b.causal_conv1d_silu_backward(x, weight, pre, d_out, d_x, d_weight, d_bias, spec)
        })
    }
    fn ssd_scan_forward(
        &self,
        inputs: megatron_core::SsdTensors,
        y: &mut T,
        states: &mut T,
        spec: megatron_core::SsdSpec,
    ) -> Result<()> {
        self.timed("ssd_scan_forward", |b| b.ssd_scan_forward(inputs, y, states, spec))
    }
    fn ssd_scan_backward(
        &self,
        inputs: megatron_core::SsdTensors,
        states: &T,
        dy: &T,
        grads: megatron_core::SsdGradTensors,
        spec: megatron_core::SsdSpec,
    ) -> Result<()> {
        self.timed("ssd_scan_backward", |b| b.ssd_scan_backward(inputs, states, dy, grads, spec))
    }
    #[allow(clippy::too_many_arguments)]
    fn gated_rmsnorm_forward(
        &self,
        y: &T,
        z: &T,
        weight: &T,
        groups: usize,
        eps: f32,
        out: &mut T,
        rstd: &mut T,
    ) -> Result<()> {
        self.timed("gated_rmsnorm_forward", |b| b.gated_rmsnorm_forward(y, z, weight, groups, eps, out, rstd))
    }
    #[allow(clippy::too_many_arguments)]
    fn gated_rmsnorm_backward(
        &self,
        y: &T,
        z: &T,
        weight: &T,
        groups: usize,
        rstd: &T,
        d_out: &T,
        d_y: &mut T,
        d_z: &mut T,
        d_weight: &mut T,
    ) -> Result<()> {
        self.timed("gated_rmsnorm_backward", |b| {
            b.gated_rmsnorm_backward(y, z, weight, groups, rstd, d_out, d_y, d_z, d_weight)
        })
    }
}

impl RingAttentionOps for ProfilingBackend {
    // Context parallelism's ring-attention blocks and the Mamba-2 ops, passed through timed.
    #[allow(clippy::too_many_arguments)]
    fn attention_block_forward(
        &self,
        q: &T,
        k: &T,
        v: &T,
        q_pos: &T,
        k_pos: &T,
        out: &mut T,
        lse: &mut T,
        spec: megatron_core::AttentionBlockSpec,
    ) -> Result<()> {
        self.timed("attention_block_forward", |b| b.attention_block_forward(q, k, v, q_pos, k_pos, out, lse, spec))
    }
    fn attention_lse_merge(
        &self,
        out: &mut T,
        lse: &mut T,
        block_out: &T,
        block_lse: &T,
        spec: megatron_core::AttentionBlockSpec,
    ) -> Result<()> {
        self.timed("attention_lse_merge", |b| b.attention_lse_merge(out, lse, block_out, block_lse, spec))
    }
    #[allow(clippy::too_many_arguments)]
    fn attention_block_backward(
        &self,
        d_out: &T,
        q: &T,
        k: &T,
        v: &T,
        q_pos: &T,
        k_pos: &T,
        lse: &T,
        delta: &T,
        dq: &mut T,
        dk: &mut T,
        dv: &mut T,
        spec: megatron_core::AttentionBlockSpec,
    ) -> Result<()> {
        self.timed("attention_block_backward", |b| {
            b.attention_block_backward(d_out, q, k, v, q_pos, k_pos, lse, delta, dq, dk, dv, spec)
        })
    }
}
