//! Reference incremental-decoding attention: the caches and new tokens are concatenated
//! explicitly and every query runs a plain softmax over its visible keys, in f64.

use megatron_core::KvCacheAttentionSpec;

/// Returns `(out (B, Tq, heads*hd), k_cache, v_cache)` after appending the new tokens of
/// `qkv (B, Tq, heads, 3, hd)` to copies of the caches `(B, capacity, heads, hd)`.
pub fn attention_kv_cache(
    qkv: &[f64],
    k_cache: &[f64],
    v_cache: &[f64],
    key_start: &[usize],
    s: &KvCacheAttentionSpec,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (tq, h, hd, cap) = (s.new_tokens, s.heads, s.head_dim, s.capacity);
    let (mut k, mut v) = (k_cache.to_vec(), v_cache.to_vec());
    let qkv_at = |b: usize, i: usize, head: usize, slot: usize| ((b * tq + i) * h + head) * 3 * hd + slot * hd;
    let cache_at = |b: usize, j: usize, head: usize| ((b * cap + j) * h + head) * hd;
    for b in 0..s.batch {
        for i in 0..tq {
            for head in 0..h {
                for d in 0..hd {
                    k[cache_at(b, s.offset + i, head) + d] = qkv[qkv_at(b, i, head, 1) + d];
                    v[cache_at(b, s.offset + i, head) + d] = qkv[qkv_at(b, i, head, 2) + d];
                }
            }
        }
    }
    let mut out = vec![0.0; s.batch * tq * h * hd];
    for b in 0..s.batch {
        for i in 0..tq {
            let pos = s.offset + i;
            for head in 0..h {
                let keys: Vec<usize> = (key_start[b]..=pos).collect();
                if keys.is_empty() {
                    continue;
                }
                let scores: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        (0..hd).map(|d| qkv[qkv_at(b, i, head, 0) + d] * k[cache_at(b, j, head) + d]).sum::<f64>()
                            * s.scale as f64
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|x| (x - m).exp()).sum();
                for (n, &j) in keys.iter().enumerate() {
                    let p = (scores[n] - m).exp() / z;
                    for d in 0..hd {
                        out[((b * tq + i) * h + head) * hd + d] += p * v[cache_at(b, j, head) + d];
                    }
                }
            }
        }
    }
    (out, k, v)
}
