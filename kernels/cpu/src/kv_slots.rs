//! Slotted-cache attention ([`megatron_core::Backend::attention_kv_cache_slots`]) for
//! continuous batching: each row of the call is one cache slot with its own cached length.
//!
//! Same loop as [`crate::kv_attention`] (one rayon task per output row, all heads inside,
//! fixed summation order), with the cache row and the causal limit taken per row.

use crate::check::{f32s, f32s_mut, numel};
// The unslotted kernel's dot product: one summation order, so a slot decodes bit-identically
// to a one-row cache.
use crate::kv_attention::dot;
use megatron_core::anyhow::bail;
use megatron_core::{DeviceTensor, KvCacheAttentionSpec, Result};
use rayon::prelude::*;

const OP: &str = "attention_kv_cache_slots";

/// Checks slot ids (in range, distinct) and that every row's new tokens fit its slot.
fn check_rows(slots: &[usize], offsets: &[usize], n_slots: usize, s: &KvCacheAttentionSpec) -> Result<()> {
    if slots.len() != s.batch || offsets.len() != s.batch {
        bail!("cpu backend: `{OP}`: {} slots and {} offsets for {} rows", slots.len(), offsets.len(), s.batch);
    }
    let mut seen = vec![false; n_slots];
    for (&slot, &off) in slots.iter().zip(offsets) {
        if slot >= n_slots || std::mem::replace(&mut seen[slot], true) {
            bail!("cpu backend: `{OP}`: slot {slot} is out of range [0, {n_slots}) or used twice");
        }
        if off + s.new_tokens > s.capacity {
            bail!(
                "cpu backend: `{OP}`: slot {slot}: {off} cached + {} new tokens exceed the capacity {}",
                s.new_tokens,
                s.capacity
            );
        }
    }
    Ok(())
}

/// See the trait method. Caches are `(S, capacity, heads, head_dim)`.
pub fn attention_kv_cache_slots(
    qkv: &DeviceTensor,
    k_cache: &mut DeviceTensor,
    v_cache: &mut DeviceTensor,
    slots: &[usize],
    offsets: &[usize],
    out: &mut DeviceTensor,
    s: KvCacheAttentionSpec,
) -> Result<()> {
    let (b, tq, h, hd) = (s.batch, s.new_tokens, s.heads, s.head_dim);
    let row = h * hd;
    let per_slot = s.capacity * row;
    if per_slot == 0 || !k_cache.numel().is_multiple_of(per_slot) {
        bail!(
            "cpu backend: `{OP}`: k_cache has {} elements, not a multiple of capacity*heads*head_dim",
            k_cache.numel()
        );
    }
    let n_slots = k_cache.numel() / per_slot;
    numel(OP, "qkv", qkv, b * tq * h * 3 * hd, "(B, Tq, heads, 3, head_dim)")?;
    numel(OP, "v_cache", v_cache, n_slots * per_slot, "(S, capacity, heads, head_dim) like k_cache")?;
    numel(OP, "out", out, b * tq * row, "(B, Tq, heads*head_dim)")?;
    check_rows(slots, offsets, n_slots, &s)?;
    let x = f32s(OP, "qkv", qkv)?;
    let kc = f32s_mut(OP, "k_cache", k_cache)?;
    let vc = f32s_mut(OP, "v_cache", v_cache)?;
    for bi in 0..b {
        for i in 0..tq {
            let dst = (slots[bi] * s.capacity + offsets[bi] + i) * row;
            for head in 0..h {
                let src = ((bi * tq + i) * h + head) * 3 * hd;
                kc[dst + head * hd..dst + (head + 1) * hd].copy_from_slice(&x[src + hd..src + 2 * hd]);
                vc[dst + head * hd..dst + (head + 1) * hd].copy_from_slice(&x[src + 2 * hd..src + 3 * hd]);
            }
        }
    }
    let (kc, vc) = (&*kc, &*vc);
    let o = f32s_mut(OP, "out", out)?;
    o.par_chunks_mut(row).enumerate().for_each(|(r, out_row)| {
        let (bi, i) = (r / tq, r % tq);
        let n_keys = offsets[bi] + i + 1;
        let base = slots[bi] * s.capacity;
        let mut scores = vec![0f32; n_keys];
        for head in 0..h {
            let q = &x[((bi * tq + i) * h + head) * 3 * hd..][..hd];
            let o_h = &mut out_row[head * hd..(head + 1) * hd];
            o_h.fill(0.0);
            let key = |j: usize| (base + j) * row + head * hd;
            let mut max = f32::NEG_INFINITY;
            for (j, sc) in scores.iter_mut().enumerate() {
                *sc = dot(q, &kc[key(j)..][..hd]) * s.scale;
                max = max.max(*sc);
            }
            let mut sum = 0f32;
            for sc in scores.iter_mut() {
                *sc = (*sc - max).exp();
                sum += *sc;
            }
            let inv = 1.0 / sum;
            for (j, &p) in scores.iter().enumerate() {
                let w = p * inv;
                for (acc, &v) in o_h.iter_mut().zip(&vc[key(j)..][..hd]) {
                    *acc += w * v;
                }
            }
        }
    });
    Ok(())
}
