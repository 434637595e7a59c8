//! Reference of the ring-attention block ops ([`megatron_core::attention_block`]) in f64:
//! full softmax per query over its visible keys, the log-sum-exp merge, and the block
//! backward written out from its definition.

use megatron_core::AttentionBlockSpec;

fn q_at(s: &AttentionBlockSpec, b: usize, i: usize, h: usize) -> usize {
    ((b * s.q_len + i) * s.heads + h) * s.head_dim
}
fn k_at(s: &AttentionBlockSpec, b: usize, j: usize, h: usize) -> usize {
    ((b * s.k_len + j) * s.heads + h) * s.head_dim
}
fn stat_at(s: &AttentionBlockSpec, b: usize, h: usize, i: usize) -> usize {
    (b * s.heads + h) * s.q_len + i
}
fn score(s: &AttentionBlockSpec, q: &[f64], k: &[f64], b: usize, h: usize, i: usize, j: usize) -> f64 {
    let (qi, kj) = (q_at(s, b, i, h), k_at(s, b, j, h));
    s.scale as f64 * (0..s.head_dim).map(|e| q[qi + e] * k[kj + e]).sum::<f64>()
}
fn visible(s: &AttentionBlockSpec, qp: &[i32], kp: &[i32], i: usize, j: usize) -> bool {
    !s.causal || kp[j] <= qp[i]
}

/// `(out (B, Tq, heads, hd), lse (B, heads, Tq))`; no visible key: 0 and -inf.
pub fn attention_block_forward(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    qp: &[i32],
    kp: &[i32],
    s: &AttentionBlockSpec,
) -> (Vec<f64>, Vec<f64>) {
    let mut out = vec![0.0; s.q_numel()];
    let mut lse = vec![f64::NEG_INFINITY; s.stat_numel()];
    for b in 0..s.batch {
        for h in 0..s.heads {
            for i in 0..s.q_len {
                let keys: Vec<usize> = (0..s.k_len).filter(|&j| visible(s, qp, kp, i, j)).collect();
                if keys.is_empty() {
                    continue;
                }
                let sc: Vec<f64> = keys.iter().map(|&j| score(s, q, k, b, h, i, j)).collect();
                let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = sc.iter().map(|x| (x - mx).exp()).sum();
                lse[stat_at(s, b, h, i)] = mx + z.ln();
                for (&j, x) in keys.iter().zip(&sc) {
                    let p = (x - mx).exp() / z;
                    for e in 0..s.head_dim {
                        out[q_at(s, b, i, h) + e] += p * v[k_at(s, b, j, h) + e];
                    }
                }
            }
        }
    }
    (out, lse)
}

/// Merges `(block_out, block_lse)` into `(out, lse)`.
pub fn attention_lse_merge(
    out: &mut [f64],
    lse: &mut [f64],
    block_out: &[f64],
    block_lse: &[f64],
    s: &AttentionBlockSpec,
) {
    for b in 0..s.batch {
        for h in 0..s.heads {
            for i in 0..s.q_len {
                let si = stat_at(s, b, h, i);
                let (a, c) = (lse[si], block_lse[si]);
                let m = if a == f64::NEG_INFINITY && c == f64::NEG_INFINITY {
                    continue;
                } else {
                    a.max(c) + ((a - a.max(c)).exp() + (c - a.max(c)).exp()).ln()
                };
                let (wa, wc) = ((a - m).exp(), (c - m).exp());
                for e in 0..s.head_dim {
                    let r = q_at(s, b, i, h) + e;
                    out[r] = out[r] * wa + block_out[r] * wc;
                }
                lse[si] = m;
            }
        }
    }
}

/// `(dq, dk, dv)` of one block given the final `lse` and `delta = Σ dO·O`.
#[allow(clippy::too_many_arguments)]
pub fn attention_block_backward(
    d_out: &[f64],
    q: &[f64],
    k: &[f64],
    v: &[f64],
    qp: &[i32],
    kp: &[i32],
    lse: &[f64],
    delta: &[f64],
    s: &AttentionBlockSpec,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut dq, mut dk, mut dv) = (vec![0.0; s.q_numel()], vec![0.0; s.k_numel()], vec![0.0; s.k_numel()]);
    let sc = s.scale as f64;
    for b in 0..s.batch {
        for h in 0..s.heads {
            for i in 0..s.q_len {
                let si = stat_at(s, b, h, i);
                if lse[si] == f64::NEG_INFINITY {
                    continue;
                }
                for j in (0..s.k_len).filter(|&j| visible(s, qp, kp, i, j)) {
                    let p = (score(s, q, k, b, h, i, j) - lse[si]).exp();
                    let (qi, kj) = (q_at(s, b, i, h), k_at(s, b, j, h));
                    let dp: f64 = (0..s.head_dim).map(|e| d_out[qi + e] * v[kj + e]).sum();
                    let ds = p * (dp - delta[si]);
                    for e in 0..s.head_dim {
                        dv[kj + e] += p * d_out[qi + e];
                        dq[qi + e] += sc * ds * k[kj + e];
                        dk[kj + e] += sc * ds * q[qi + e];
                    }
                }
            }
        }
    }
    (dq, dk, dv)
}
