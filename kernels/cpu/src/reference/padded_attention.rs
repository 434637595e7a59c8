//! Reference key-padding-mask attention: an explicit masked `(T, T)` score matrix per
//! (batch, head), Megatron's `mask[b, i, j] = not (real_i and real_j)`, padded queries zero.

use crate::rng::DropoutMask;
use megatron_core::padded_attention::padded_row_seed;
use megatron_core::PaddedAttentionSpec;

fn at(s: &PaddedAttentionSpec, b: usize, t: usize, h: usize, slot: usize) -> usize {
    ((b * s.seq + t) * s.heads + h) * 3 * s.head_dim + slot * s.head_dim
}

fn out_at(s: &PaddedAttentionSpec, b: usize, t: usize, h: usize) -> usize {
    (b * s.seq + t) * s.heads * s.head_dim + h * s.head_dim
}

/// Dropout multiplier of probability `(b, h, i, j)` in a row of length `len`.
fn drop_factor(s: &PaddedAttentionSpec, b: usize, len: usize, h: usize, i: usize, j: usize) -> f64 {
    if s.dropout_p == 0.0 {
        return 1.0;
    }
    let mask = DropoutMask::new(padded_row_seed(s.dropout_seed, b), s.dropout_p);
    mask.factor(((h * len + i) * len + j) as u64) as f64
}

/// Probabilities `P (T, T)` (zero where masked) and `lse (T)` (zero for padded queries).
fn probs(qkv: &[f64], s: &PaddedAttentionSpec, len: usize, b: usize, h: usize) -> (Vec<f64>, Vec<f64>) {
    let t = s.seq;
    let real = |i: usize| i < len;
    let mut p = vec![0.0; t * t];
    let mut lse = vec![0.0; t];
    for i in (0..t).filter(|&i| real(i)) {
        let scores: Vec<f64> = (0..t)
            .map(|j| {
                if !real(j) {
                    return f64::NEG_INFINITY; // masked key
                }
                let dot: f64 = (0..s.head_dim).map(|d| qkv[at(s, b, i, h, 0) + d] * qkv[at(s, b, j, h, 1) + d]).sum();
                dot * s.scale as f64
            })
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = scores.iter().map(|v| (v - m).exp()).sum();
        for j in 0..t {
            p[i * t + j] = (scores[j] - m).exp() / z;
        }
        lse[i] = m + z.ln();
    }
    (p, lse)
}

/// Returns `(out (B, T, heads*hd), lse (B, heads, T))`; `lengths` `(B)`.
pub fn attention_padded_forward(qkv: &[f64], lengths: &[usize], s: &PaddedAttentionSpec) -> (Vec<f64>, Vec<f64>) {
    let (t, hd) = (s.seq, s.head_dim);
    let mut out = vec![0.0; s.batch * t * s.heads * hd];
    let mut lse = vec![0.0; s.batch * s.heads * t];
    for (b, &len) in lengths.iter().enumerate() {
        for h in 0..s.heads {
            let (p, l) = probs(qkv, s, len, b, h);
            lse[(b * s.heads + h) * t..(b * s.heads + h + 1) * t].copy_from_slice(&l);
            for i in 0..t {
                for j in 0..t {
                    if p[i * t + j] == 0.0 {
                        continue;
                    }
                    let w = p[i * t + j] * drop_factor(s, b, len, h, i, j);
                    for d in 0..hd {
                        out[out_at(s, b, i, h) + d] += w * qkv[at(s, b, j, h, 2) + d];
                    }
                }
            }
        }
    }
    (out, lse)
}

/// `d_qkv` of `Σ d_out · attention_padded_forward(qkv).0` by the chain rule.
pub fn attention_padded_backward(d_out: &[f64], qkv: &[f64], lengths: &[usize], s: &PaddedAttentionSpec) -> Vec<f64> {
    let (t, hd, sc) = (s.seq, s.head_dim, s.scale as f64);
    let mut dx = vec![0.0; qkv.len()];
    for (b, &len) in lengths.iter().enumerate() {
        for h in 0..s.heads {
            let (p, _) = probs(qkv, s, len, b, h);
            for i in 0..len {
                let g = &d_out[out_at(s, b, i, h)..out_at(s, b, i, h) + hd];
                // dP_ij = f_ij (dO_i · V_j), dS_ij = P_ij (dP_ij - Σ_k P_ik dP_ik)
                let dp: Vec<f64> = (0..len)
                    .map(|j| {
                        let gv: f64 = (0..hd).map(|d| g[d] * qkv[at(s, b, j, h, 2) + d]).sum();
                        drop_factor(s, b, len, h, i, j) * gv
                    })
                    .collect();
                let row_dot: f64 = (0..len).map(|j| p[i * t + j] * dp[j]).sum();
                for j in 0..len {
                    let pij = p[i * t + j];
                    let ds = pij * (dp[j] - row_dot) * sc;
                    let pd = pij * drop_factor(s, b, len, h, i, j);
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
