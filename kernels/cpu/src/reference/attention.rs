//! Reference attention (explicit `(T, T)` score matrix per (batch, head) and a plain softmax)
//! and rotary embedding, on the fused `(B, T, heads, 3, head_dim)` QKV layout.

use crate::rng::DropoutMask;
use megatron_core::{AttentionSpec, RotarySpec};

fn at(s: &AttentionSpec, b: usize, t: usize, h: usize, slot: usize) -> usize {
    ((b * s.seq + t) * s.heads + h) * 3 * s.head_dim + slot * s.head_dim
}

fn out_at(s: &AttentionSpec, b: usize, t: usize, h: usize) -> usize {
    (b * s.seq + t) * s.heads * s.head_dim + h * s.head_dim
}

/// Multiplier of probability `(b, h, i, j)`: `1/(1-p)` or 0 (1 without dropout).
fn drop_factor(s: &AttentionSpec, b: usize, h: usize, i: usize, j: usize) -> f64 {
    if s.dropout_p == 0.0 {
        return 1.0;
    }
    let mask = DropoutMask::new(s.dropout_seed, s.dropout_p);
    mask.factor((((b * s.heads + h) * s.seq + i) * s.seq + j) as u64) as f64
}

/// Softmax probabilities `P (T, T)` (undropped) and `lse (T)` of one (b, h).
fn probs(qkv: &[f64], s: &AttentionSpec, b: usize, h: usize) -> (Vec<f64>, Vec<f64>) {
    let (t, hd) = (s.seq, s.head_dim);
    let mut p = vec![0.0; t * t];
    let mut lse = vec![0.0; t];
    for i in 0..t {
        let jmax = if s.causal { i + 1 } else { t };
        let scores: Vec<f64> = (0..jmax)
            .map(|j| {
                (0..hd).map(|d| qkv[at(s, b, i, h, 0) + d] * qkv[at(s, b, j, h, 1) + d]).sum::<f64>() * s.scale as f64
            })
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = scores.iter().map(|v| (v - m).exp()).sum();
        for j in 0..jmax {
            p[i * t + j] = (scores[j] - m).exp() / z;
        }
        lse[i] = m + z.ln();
    }
    (p, lse)
}

/// Returns `(out (B, T, heads*hd), lse (B, heads, T))`.
pub fn attention_forward(qkv: &[f64], s: &AttentionSpec) -> (Vec<f64>, Vec<f64>) {
    let (t, hd) = (s.seq, s.head_dim);
    let mut out = vec![0.0; s.batch * t * s.heads * hd];
    let mut lse = vec![0.0; s.batch * s.heads * t];
    for b in 0..s.batch {
        for h in 0..s.heads {
            let (p, l) = probs(qkv, s, b, h);
            lse[(b * s.heads + h) * t..(b * s.heads + h + 1) * t].copy_from_slice(&l);
            for i in 0..t {
                for j in 0..t {
                    let w = p[i * t + j] * drop_factor(s, b, h, i, j);
                    for d in 0..hd {
                        out[out_at(s, b, i, h) + d] += w * qkv[at(s, b, j, h, 2) + d];
                    }
                }
            }
        }
    }
    (out, lse)
}

/// `d_qkv` of `Σ d_out · attention_forward(qkv).0`, by the textbook chain rule.
pub fn attention_backward(d_out: &[f64], qkv: &[f64], s: &AttentionSpec) -> Vec<f64> {
    let (t, hd, sc) = (s.seq, s.head_dim, s.scale as f64);
    let mut dx = vec![0.0; qkv.len()];
    for b in 0..s.batch {
        for h in 0..s.heads {
            let (p, _) = probs(qkv, s, b, h);
            for i in 0..t {
                let g = &d_out[out_at(s, b, i, h)..out_at(s, b, i, h) + hd];
                // dP_ij = f_ij (dO_i · V_j), dS_ij = P_ij (dP_ij - Σ_k P_ik dP_ik)
                let dp: Vec<f64> = (0..t)
                    .map(|j| {
                        drop_factor(s, b, h, i, j) * (0..hd).map(|d| g[d] * qkv[at(s, b, j, h, 2) + d]).sum::<f64>()
                    })
                    .collect();
                let row_dot: f64 = (0..t).map(|j| p[i * t + j] * dp[j]).sum();
                for j in 0..t {
                    let pij = p[i * t + j];
                    let ds = pij * (dp[j] - row_dot) * sc;
                    let pd = pij * drop_factor(s, b, h, i, j);
                    for d in 0..hd {
                        dx[at(s, b, j, h, 2) + d] += pd * g[d];
                        dx[at(s, b, i, h, 0) + d] += ds * qkv[at(s, b, j, h, 1) + d];
                        dx[at(s, b, j, h, 1) + d] += ds * qkv[at(s, b, i, h, 0) + d];
                    }
                }
            }
        }
    }
    dx
}

/// Rotates q and k of every token by `pos·inv_freq` (`-θ` when `inverse`). Angles are formed
/// in f32 exactly as Megatron does; the rotation itself is f64.
pub fn rotary(qkv: &mut [f64], s: &RotarySpec, inverse: bool) {
    let (half, hd) = (s.rotary_dim / 2, s.head_dim);
    for b in 0..s.batch {
        for t in 0..s.seq {
            let pos = (s.position_offset + t) as f32;
            for h in 0..s.heads {
                for slot in 0..2 {
                    let base = ((b * s.seq + t) * s.heads + h) * 3 * hd + slot * hd;
                    for i in 0..half {
                        let inv_freq = 1.0 / s.base.powf((2 * i) as f32 / s.rotary_dim as f32);
                        let theta = (pos * inv_freq) as f64;
                        let (sin, cos) = if inverse { (-theta.sin(), theta.cos()) } else { (theta.sin(), theta.cos()) };
                        let (a, c) = if s.interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
                        let (x1, x2) = (qkv[base + a], qkv[base + c]);
                        qkv[base + a] = x1 * cos - x2 * sin;
                        qkv[base + c] = x2 * cos + x1 * sin;
                    }
                }
            }
        }
    }
}
