//! [`KvCacheOps`]: attention against key/value caches for generation and serving: one cache
//! for the whole batch ([`KvCacheAttentionSpec`]) or one slot per row (continuous batching).

use super::MemoryOps;
use crate::{DeviceTensor, Result};

/// Attention of new queries against a per-layer key/value cache (incremental decoding).
///
/// `qkv` is the fused `(B, Tq, heads, 3, head_dim)` of the `Tq` new tokens of every row; their
/// k and v are first written into the caches `(B, capacity, heads, head_dim)` at positions
/// `[offset, offset + Tq)`. New query `i` (absolute position `p = offset + i`) then attends to
/// the cached keys `j` with `key_start[b] <= j <= p` (causal; `key_start` masks left padding,
/// all zeros when absent); a query with no key gets a zero output. `out` is
/// `(B, Tq, heads*head_dim)`. Nothing is saved: inference only.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvCacheAttentionSpec {
    pub batch: usize,
    /// New tokens per row in this call: the prompt prefix when prefilling, 1 when decoding.
    pub new_tokens: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Length of the caches' sequence dim.
    pub capacity: usize,
    /// Cache position of the first new token (the number of tokens already cached).
    pub offset: usize,
    /// Multiplies `q·k` before the softmax (`1/sqrt(head_dim)`).
    pub scale: f32,
}

/// Incremental-decoding attention (inference only).
pub trait KvCacheOps: MemoryOps {
    /// See [`KvCacheAttentionSpec`]: appends the new k/v to the caches, then attends. Backends
    /// that cannot decode incrementally keep this default, an error naming the backend.
    #[allow(clippy::too_many_arguments)]
    fn attention_kv_cache(
        &self,
        qkv: &DeviceTensor,
        k_cache: &mut DeviceTensor,
        v_cache: &mut DeviceTensor,
        key_start: Option<&DeviceTensor>,
        out: &mut DeviceTensor,
        spec: KvCacheAttentionSpec,
    ) -> Result<()> {
        let _ = (qkv, k_cache, v_cache, key_start, out, spec);
        anyhow::bail!(
            "op `attention_kv_cache` is not supported by backend `{}`; generate with --no-kv-cache \
             (full recompute) or use a backend that implements it (cpu)",
            self.name()
        )
    }
    /// Continuous batching: attention against a *slotted* key/value cache, where every row of
    /// the call has its own cache slot and its own number of cached tokens. Row `r` of `qkv`
    /// `(B, Tq, heads, 3, head_dim)` is slot `slots[r]` of `k_cache`/`v_cache`
    /// `(S, capacity, heads, head_dim)`: its `Tq` new k/v are written at positions
    /// `[offsets[r], offsets[r] + Tq)` of that slot, and its query `i` attends causally to the
    /// slot's keys `[0, offsets[r] + i]`. `spec.batch` is `B` (rows of this call, distinct
    /// slots); `spec.offset` is unused. Backends without it keep this default error.
    #[allow(clippy::too_many_arguments)]
    fn attention_kv_cache_slots(
        &self,
        qkv: &DeviceTensor,
        k_cache: &mut DeviceTensor,
        v_cache: &mut DeviceTensor,
        slots: &[usize],
        offsets: &[usize],
        out: &mut DeviceTensor,
        spec: KvCacheAttentionSpec,
    ) -> Result<()> {
        let _ = (qkv, k_cache, v_cache, slots, offsets, out, spec);
        anyhow::bail!(
            "op `attention_kv_cache_slots` (continuous batching) is not supported by backend `{}`; \
             serve with --batching static or use the cpu backend",
            self.name()
        )
    }
}
