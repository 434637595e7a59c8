//! Reference cross-attention ([`megatron_core::CrossAttentionSpec`]): an explicit `(Tq, Tk)`
//! score matrix per (batch, head), valid lengths, causal mask, additive bias and a plain
//! softmax, in f64.

use crate::rng::DropoutMask;
use megatron_core::CrossAttentionSpec;

fn q_at(s: &CrossAttentionSpec, b: usize, i: usize, h: usize) -> usize {
    ((b * s.q_len + i) * s.heads + h) * s.head_dim
}

/// Offset of k (`slot` 0) or v (1) of key `j`.
fn kv_at(s: &CrossAttentionSpec, b: usize, j: usize, h: usize, slot: usize) -> usize {
    ((b * s.kv_len + j) * s.heads + h) * 2 * s.head_dim + slot * s.head_dim
}

fn drop_factor(s: &CrossAttentionSpec, b: usize, h: usize, i: usize, j: usize) -> f64 {
    if s.dropout_p == 0.0 {
        return 1.0;
    }
    let mask = DropoutMask::new(s.dropout_seed, s.dropout_p);
    mask.factor((((b * s.heads + h) * s.q_len + i) * s.kv_len + j) as u64) as f64
}

/// The keys query `i` of row `b` sees: `0..n` (0 when the query is padding).
fn visible(s: &CrossAttentionSpec, qv: &[i32], kv: &[i32], b: usize, i: usize) -> usize {
    let qv = qv.get(b).map_or(s.q_len, |&v| (v.max(0) as usize).min(s.q_len));
    let kv = kv.get(b).map_or(s.kv_len, |&v| (v.max(0) as usize).min(s.kv_len));
    if i >= qv {
        return 0;
    }
    if s.causal {
        kv.min(i + 1)
    } else {
        kv
    }
}

/// Probabilities `P (Tq, Tk)` (undropped, 0 where masked) and `lse (Tq)` of one (b, h).
/// `q_valid`/`kv_valid` empty = no padding; `bias` empty = none.
#[allow(clippy::too_many_arguments)]
fn probs(
    q: &[f64],
    kv: &[f64],
    qv: &[i32],
    kvv: &[i32],
    bias: &[f64],
    s: &CrossAttentionSpec,
    b: usize,
    h: usize,
) -> (Vec<f64>, Vec<f64>) {
    let (tq, tk, hd) = (s.q_len, s.kv_len, s.head_dim);
    let mut p = vec![0.0; tq * tk];
    let mut lse = vec![0.0; tq];
    for i in 0..tq {
        let n = visible(s, qv, kvv, b, i);
        if n == 0 {
            continue;
        }
        let scores: Vec<f64> = (0..n)
            .map(|j| {
                let dot: f64 = (0..hd).map(|d| q[q_at(s, b, i, h) + d] * kv[kv_at(s, b, j, h, 0) + d]).sum();
                dot * s.scale as f64 + bias.get((h * tq + i) * tk + j).copied().unwrap_or(0.0)
            })
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = scores.iter().map(|v| (v - m).exp()).sum();
        for j in 0..n {
            p[i * tk + j] = (scores[j] - m).exp() / z;
        }
        lse[i] = m + z.ln();
    }
    (p, lse)
}

/// Returns `(out (B, Tq, heads*hd), lse (B, heads, Tq))`.
pub fn cross_attention_forward(
    q: &[f64],
    kv: &[f64],
    q_valid: &[i32],
    kv_valid: &[i32],
    bias: &[f64],
    s: &CrossAttentionSpec,
) -> (Vec<f64>, Vec<f64>) {
    let (tq, tk, hd) = (s.q_len, s.kv_len, s.head_dim);
    let mut out = vec![0.0; s.q_numel()];
    let mut lse = vec![0.0; s.lse_numel()];
    for b in 0..s.batch {
        for h in 0..s.heads {
            let (p, l) = probs(q, kv, q_valid, kv_valid, bias, s, b, h);
            lse[(b * s.heads + h) * tq..(b * s.heads + h + 1) * tq].copy_from_slice(&l);
            for i in 0..tq {
                for j in 0..tk {
                    let w = p[i * tk + j] * drop_factor(s, b, h, i, j);
                    for d in 0..hd {
                        out[q_at(s, b, i, h) + d] += w * kv[kv_at(s, b, j, h, 1) + d];
                    }
                }
            }
        }
    }
    (out, lse)
}

/// `(d_q, d_kv, d_bias)` of `Σ d_out · cross_attention_forward(..).0`, by the textbook chain
/// rule (`d_bias` is `(heads, Tq, Tk)`, summed over the batch).
pub fn cross_attention_backward(
    d_out: &[f64],
    q: &[f64],
    kv: &[f64],
    q_valid: &[i32],
    kv_valid: &[i32],
    bias: &[f64],
    s: &CrossAttentionSpec,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (tq, tk, hd, sc) = (s.q_len, s.kv_len, s.head_dim, s.scale as f64);
    let (mut dq, mut dkv, mut db) = (vec![0.0; q.len()], vec![0.0; kv.len()], vec![0.0; s.bias_numel()]);
    for b in 0..s.batch {
        for h in 0..s.heads {
            let (p, _) = probs(q, kv, q_valid, kv_valid, bias, s, b, h);
            for i in 0..tq {
                let g = &d_out[q_at(s, b, i, h)..q_at(s, b, i, h) + hd];
                // dP_ij = f_ij (dO_i · V_j), dS_ij = P_ij (dP_ij - Σ_k P_ik dP_ik)
                let dp: Vec<f64> = (0..tk)
                    .map(|j| {
                        drop_factor(s, b, h, i, j) * (0..hd).map(|d| g[d] * kv[kv_at(s, b, j, h, 1) + d]).sum::<f64>()
                    })
                    .collect();
                let row_dot: f64 = (0..tk).map(|j| p[i * tk + j] * dp[j]).sum();
                for j in 0..tk {
                    let pij = p[i * tk + j];
                    let ds = pij * (dp[j] - row_dot);
                    db[(h * tq + i) * tk + j] += ds;
                    let pd = pij * drop_factor(s, b, h, i, j);
                    for d in 0..hd {
                        dkv[kv_at(s, b, j, h, 1) + d] += pd * g[d];
                        dq[q_at(s, b, i, h) + d] += ds * sc * kv[kv_at(s, b, j, h, 0) + d];
                        dkv[kv_at(s, b, j, h, 0) + d] += ds * sc * q[q_at(s, b, i, h) + d];
                    }
                }
            }
        }
    }
    (dq, dkv, db)
}
