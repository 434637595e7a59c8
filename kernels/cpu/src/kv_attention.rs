//! Incremental-decoding attention ([`megatron_core::KvCacheOps::attention_kv_cache`]): writes the
//! new tokens' k/v into the per-layer caches, then attends each new query to its cached keys.
//!
//! Decoding runs one query per row against at most a few thousand keys, so a plain per-row
//! loop (one rayon task per `(b, query)` output row, all heads inside) is memory-bound on
//! reading the cache and needs no tiling; the prefill step (`Tq` queries) reuses the same loop.

use crate::check::{f32s, f32s_mut, i32s, numel};
use megatron_core::anyhow::bail;
use megatron_core::{DeviceTensor, KvCacheAttentionSpec, Result};
use rayon::prelude::*;

const OP: &str = "attention_kv_cache";

/// Validates shapes and positions; returns the per-row first valid key.
fn key_starts(key_start: Option<&DeviceTensor>, s: &KvCacheAttentionSpec) -> Result<Vec<usize>> {
    if s.offset + s.new_tokens > s.capacity {
        bail!(
            "cpu backend: `{OP}`: {} cached + {} new tokens exceed the cache capacity {}; allocate a longer cache",
            s.offset,
            s.new_tokens,
            s.capacity
        );
    }
    match key_start {
        None => Ok(vec![0; s.batch]),
        Some(t) => {
            numel(OP, "key_start", t, s.batch, "one first-key position per row")?;
            i32s(OP, "key_start", t)?
                .iter()
                .map(|&k| {
                    usize::try_from(k)
                        .map_err(|_| megatron_core::anyhow::anyhow!("cpu backend: `{OP}`: key_start {k} must be >= 0"))
                })
                .collect()
        }
    }
}

/// See [`megatron_core::KvCacheAttentionSpec`]. Caches are `(B, capacity, heads, head_dim)`.
pub fn attention_kv_cache(
    qkv: &DeviceTensor,
    k_cache: &mut DeviceTensor,
    v_cache: &mut DeviceTensor,
    key_start: Option<&DeviceTensor>,
    out: &mut DeviceTensor,
    s: KvCacheAttentionSpec,
) -> Result<()> {
    let (b, tq, h, hd) = (s.batch, s.new_tokens, s.heads, s.head_dim);
    numel(OP, "qkv", qkv, b * tq * h * 3 * hd, "(B, Tq, heads, 3, head_dim)")?;
    numel(OP, "k_cache", k_cache, b * s.capacity * h * hd, "(B, capacity, heads, head_dim)")?;
    numel(OP, "v_cache", v_cache, b * s.capacity * h * hd, "(B, capacity, heads, head_dim)")?;
    numel(OP, "out", out, b * tq * h * hd, "(B, Tq, heads*head_dim)")?;
    let starts = key_starts(key_start, &s)?;
    let x = f32s(OP, "qkv", qkv)?;
    let kc = f32s_mut(OP, "k_cache", k_cache)?;
    let vc = f32s_mut(OP, "v_cache", v_cache)?;
    // Append: cache row (b, offset + i) ← k/v of new token (b, i), every head.
    let row = h * hd;
    for bi in 0..b {
        for i in 0..tq {
            let dst = (bi * s.capacity + s.offset + i) * row;
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
        let pos = s.offset + i;
        let first = starts[bi];
        let mut scores = vec![0f32; (pos + 1).saturating_sub(first)];
        for head in 0..h {
            let q = &x[((bi * tq + i) * h + head) * 3 * hd..][..hd];
            let o_h = &mut out_row[head * hd..(head + 1) * hd];
            o_h.fill(0.0);
            if scores.is_empty() {
                continue; // a query with no valid key (left padding) outputs zeros
            }
            let key = |j: usize| (bi * s.capacity + j) * row + head * hd;
            let mut max = f32::NEG_INFINITY;
            for (n, sc) in scores.iter_mut().enumerate() {
                *sc = dot(q, &kc[key(first + n)..][..hd]) * s.scale;
                max = max.max(*sc);
            }
            let mut sum = 0f32;
            for sc in scores.iter_mut() {
                *sc = (*sc - max).exp();
                sum += *sc;
            }
            let inv = 1.0 / sum;
            for (n, &p) in scores.iter().enumerate() {
                let w = p * inv;
                for (acc, &v) in o_h.iter_mut().zip(&vc[key(first + n)..][..hd]) {
                    *acc += w * v;
                }
            }
        }
    });
    Ok(())
}

/// `Σ a·b` with eight independent accumulators, so the loop vectorises without reassociation.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    acc.iter().sum::<f32>() + tail
}
