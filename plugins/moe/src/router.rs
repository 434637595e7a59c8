//! `TopKRouter` math on host rows of logits `(N, E)` (SPEC §4.12, §4.15.3): scores, top-k
//! selection (with the aux-loss-free expert bias), capacity dropping, the load-balancing and
//! z-loss values with their gradients, and the backward of the gate weights to the logits.
//! Ties pick the lower expert id, so routing never depends on anything but the values.

use crate::config::MoeConfig;

/// How the top-k gate weights are computed from the logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Score {
    /// Top-k on the logits, softmax over the k (Megatron's default).
    SoftmaxPost,
    /// Softmax over all experts, then top-k (`--moe-router-pre-softmax`).
    SoftmaxPre,
    /// `σ(l)`, top-k, renormalised over the k when k > 1.
    Sigmoid,
}

impl Score {
    pub fn of(cfg: &MoeConfig) -> Score {
        match (cfg.moe_router_score_function.as_str(), cfg.moe_router_pre_softmax) {
            ("sigmoid", _) => Score::Sigmoid,
            (_, true) => Score::SoftmaxPre,
            _ => Score::SoftmaxPost,
        }
    }
}

fn softmax(row: &[f32]) -> Vec<f32> {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f64> = row.iter().map(|&v| ((v - m) as f64).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|&v| (v / s) as f32).collect()
}

fn sigmoid(v: f32) -> f32 {
    1.0 / (1.0 + (-v).exp())
}

/// The k largest of `key` (ties: lower index first).
fn topk(key: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..key.len()).collect();
    idx.sort_by(|&a, &b| key[b].total_cmp(&key[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// Group-limited routing (`--moe-router-num-groups G --moe-router-group-topk g`, SPEC §4.15.3):
/// the experts form G equal consecutive groups, a group scores the sum of its k/g largest keys,
/// and only the experts of the g best groups stay selectable (the others' keys become −∞).
/// With G = the EP size this limits every token to g devices (DeepSeek's device-limited routing).
pub fn limit_groups(key: &mut [f32], k: usize, groups: usize, group_topk: usize) {
    let per = key.len() / groups;
    let group_score: Vec<f32> = key.chunks(per).map(|g| topk(g, k / group_topk).iter().map(|&j| g[j]).sum()).collect();
    let keep = topk(&group_score, group_topk);
    for (gi, g) in key.chunks_mut(per).enumerate() {
        if !keep.contains(&gi) {
            g.fill(f32::NEG_INFINITY);
        }
    }
}

/// Top-k selection and gate weights of every token: `(idx (N,k), gate (N,k))`, the gates
/// multiplied by the scaling factor. `bias` (E) shifts the selection only; `groups` is
/// `(G, g)` for group-limited routing ([`limit_groups`]).
pub fn select(
    score: Score,
    logits: &[f32],
    e: usize,
    k: usize,
    bias: &[f32],
    scale: f32,
    groups: Option<(usize, usize)>,
) -> (Vec<i32>, Vec<f32>) {
    let n = logits.len() / e;
    let (mut idx, mut gate) = (Vec::with_capacity(n * k), Vec::with_capacity(n * k));
    for row in logits.chunks(e) {
        let s: Vec<f32> = match score {
            Score::SoftmaxPost => row.to_vec(),
            Score::SoftmaxPre => softmax(row),
            Score::Sigmoid => row.iter().map(|&v| sigmoid(v)).collect(),
        };
        let mut key: Vec<f32> = s.iter().zip(bias).map(|(a, b)| a + b).collect();
        if let Some((g, gk)) = groups {
            limit_groups(&mut key, k, g, gk);
        }
        let sel = topk(&key, k);
        let g: Vec<f32> = match score {
            Score::SoftmaxPost => softmax(&sel.iter().map(|&j| row[j]).collect::<Vec<_>>()),
            Score::SoftmaxPre => sel.iter().map(|&j| s[j]).collect(),
            Score::Sigmoid => {
                let picked: Vec<f32> = sel.iter().map(|&j| s[j]).collect();
                let sum: f32 = picked.iter().sum();
                if k > 1 {
                    picked.iter().map(|v| v / sum).collect()
                } else {
                    picked
                }
            }
        };
        idx.extend(sel.iter().map(|&j| j as i32));
        gate.extend(g.iter().map(|v| v * scale));
    }
    (idx, gate)
}

/// `d logits (N, E)` from `d gate (N, k)` (the gradient of the scaled gate weights).
pub fn select_backward(score: Score, logits: &[f32], e: usize, idx: &[i32], d_gate: &[f32], scale: f32) -> Vec<f32> {
    let k = idx.len() / (logits.len() / e).max(1);
    let mut d = vec![0.0f32; logits.len()];
    for (t, row) in logits.chunks(e).enumerate() {
        let sel: Vec<usize> = idx[t * k..(t + 1) * k].iter().map(|&j| j as usize).collect();
        let dg: Vec<f32> = d_gate[t * k..(t + 1) * k].iter().map(|v| v * scale).collect();
        let out = &mut d[t * e..(t + 1) * e];
        match score {
            Score::SoftmaxPost => {
                let g = softmax(&sel.iter().map(|&j| row[j]).collect::<Vec<_>>());
                let dot: f32 = g.iter().zip(&dg).map(|(a, b)| a * b).sum();
                for (i, &j) in sel.iter().enumerate() {
                    out[j] += g[i] * (dg[i] - dot);
                }
            }
            Score::SoftmaxPre => {
                let p = softmax(row);
                let mut dp = vec![0.0f32; e];
                for (i, &j) in sel.iter().enumerate() {
                    dp[j] += dg[i];
                }
                let dot: f32 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for j in 0..e {
                    out[j] += p[j] * (dp[j] - dot);
                }
            }
            Score::Sigmoid => {
                let s: Vec<f32> = sel.iter().map(|&j| sigmoid(row[j])).collect();
                let ds: Vec<f32> = if k > 1 {
                    let sum: f32 = s.iter().sum();
                    let g: Vec<f32> = s.iter().map(|v| v / sum).collect();
                    let dot: f32 = g.iter().zip(&dg).map(|(a, b)| a * b).sum();
                    dg.iter().map(|d| (d - dot) / sum).collect()
                } else {
                    dg.clone()
                };
                for (i, &j) in sel.iter().enumerate() {
                    out[j] += ds[i] * s[i] * (1.0 - s[i]);
                }
            }
        }
    }
    d
}

/// Capacity dropping: a `kept` mask `(N, k)` of 1/0 with at most `capacity` assignments per
/// expert; `by_prob` keeps the highest gates (ties: earlier token), else the earliest tokens.
pub fn capacity_mask(idx: &[i32], gate: &[f32], e: usize, capacity: usize, by_prob: bool) -> Vec<f32> {
    let mut kept = vec![0.0f32; idx.len()];
    let mut per_expert: Vec<Vec<usize>> = vec![Vec::new(); e];
    for (a, &j) in idx.iter().enumerate() {
        per_expert[j as usize].push(a);
    }
    for list in &mut per_expert {
        if by_prob {
            list.sort_by(|&a, &b| gate[b].total_cmp(&gate[a]).then(a.cmp(&b)));
        }
        for &a in list.iter().take(capacity) {
            kept[a] = 1.0;
        }
    }
    kept
}

/// How a rank's tokens fall into the chunks the load-balancing loss counts over: local token
/// `t` belongs to chunk `(offset + t) / rows` of `chunks` (one chunk for `aux_loss`; the
/// sequences for `seq_aux_loss`, where a sequence-parallel rank's rows start at `offset` of the
/// flattened `(B, T)`).
#[derive(Clone, Copy, Debug)]
pub struct Chunks {
    pub rows: usize,
    pub offset: usize,
    pub chunks: usize,
}

impl Chunks {
    /// Consecutive chunks of `rows` of this rank's `n` tokens.
    pub fn local(n: usize, rows: usize) -> Chunks {
        Chunks { rows: rows.max(1), offset: 0, chunks: n.div_ceil(rows.max(1)).max(1) }
    }

    fn of(&self, t: usize) -> usize {
        (self.offset + t) / self.rows
    }
}

/// Tokens routed to each expert by `idx` (before dropping), per chunk: `(chunks, E)` row-major.
pub fn counts_in(idx: &[i32], e: usize, k: usize, ch: Chunks) -> Vec<f64> {
    let mut c = vec![0.0f64; ch.chunks * e];
    for (a, &j) in idx.iter().enumerate() {
        c[ch.of(a / k) * e + j as usize] += 1.0;
    }
    c
}

/// Tokens routed to each expert by `idx` (before dropping), per sequence chunk of `rows`
/// tokens: `(chunks, E)` row-major.
pub fn counts(idx: &[i32], e: usize, k: usize, rows: usize) -> Vec<f64> {
    counts_in(idx, e, k, Chunks::local(idx.len() / k.max(1), rows))
}

/// The aux-loss scores over all experts: softmax, or sigmoid normalised over the experts.
fn aux_scores(score: Score, row: &[f32]) -> Vec<f32> {
    match score {
        Score::Sigmoid => {
            let s: Vec<f32> = row.iter().map(|&v| sigmoid(v)).collect();
            let sum: f32 = s.iter().sum();
            s.iter().map(|v| v / sum).collect()
        }
        _ => softmax(row),
    }
}

/// Switch load-balancing loss `L = coeff·E/(k·T²)·Σ_i (Σ_x p_{x,i})·n_i` per chunk (one
/// chunk: `aux_loss`; sequences: `seq_aux_loss`, averaged over them), `n` given per chunk
/// `(chunks, E)` with token total `t_total` per chunk. Only this rank's tokens enter `Σ_x`, so
/// with tokens spread over ranks (CP, SP) every rank returns its share and the shares add up.
/// Adds `grad_scale · dL/dlogits` into `d_logits` and returns the share.
#[allow(clippy::too_many_arguments)]
pub fn switch_aux_loss(
    score: Score,
    logits: &[f32],
    e: usize,
    k: usize,
    ch: Chunks,
    n: &[f64],
    t_total: f64,
    coeff: f32,
    grad_scale: f32,
    d_logits: &mut [f32],
) -> f64 {
    let c = coeff as f64 * e as f64 / (k as f64 * t_total * t_total) / ch.chunks as f64;
    let mut loss = 0.0f64;
    for (t, row) in logits.chunks(e).enumerate() {
        let counts = &n[ch.of(t) * e..(ch.of(t) + 1) * e];
        let p = aux_scores(score, row);
        loss += p.iter().zip(counts).map(|(&pi, &ni)| pi as f64 * ni).sum::<f64>() * c;
        // dL/dp_i = c·n_i, then through the score function over all experts.
        let dp: Vec<f64> = counts.iter().map(|&ni| c * ni).collect();
        let out = &mut d_logits[t * e..(t + 1) * e];
        match score {
            Score::Sigmoid => {
                // p_i = s_i / S: dL/ds_j = (dp_j - Σ p·dp) / S; ds/dl = s(1-s).
                let s: Vec<f64> = row.iter().map(|&v| sigmoid(v) as f64).collect();
                let sum: f64 = s.iter().sum();
                let dot: f64 = p.iter().zip(&dp).map(|(&a, b)| a as f64 * b).sum();
                for j in 0..e {
                    out[j] += grad_scale * ((dp[j] - dot) / sum * s[j] * (1.0 - s[j])) as f32;
                }
            }
            _ => {
                let dot: f64 = p.iter().zip(&dp).map(|(&a, b)| a as f64 * b).sum();
                for j in 0..e {
                    out[j] += grad_scale * (p[j] as f64 * (dp[j] - dot)) as f32;
                }
            }
        }
    }
    loss
}

/// Router z-loss `coeff · mean_x logsumexp(l_x)²`; adds `grad_scale · dz/dlogits`.
pub fn z_loss(logits: &[f32], e: usize, coeff: f32, grad_scale: f32, d_logits: &mut [f32]) -> f64 {
    let n = (logits.len() / e).max(1) as f64;
    let mut loss = 0.0f64;
    for (t, row) in logits.chunks(e).enumerate() {
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
        let lse = m + s.ln();
        loss += lse * lse;
        for j in 0..e {
            let p = (row[j] as f64 - lse).exp();
            d_logits[t * e + j] += grad_scale * (coeff as f64 * 2.0 * lse * p / n) as f32;
        }
    }
    coeff as f64 * loss / n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, spelled out: every choice of `g` groups, the one with the largest sum
    /// of group scores (ties: the lexicographically smallest ids, as `topk` picks them), then
    /// the top-k keys inside it.
    fn brute_force(key: &[f32], k: usize, groups: usize, g: usize) -> Vec<usize> {
        let per = key.len() / groups;
        let score = |gi: usize| -> f32 {
            let mut v: Vec<f32> = key[gi * per..(gi + 1) * per].to_vec();
            v.sort_by(|a, b| b.total_cmp(a));
            v[..k / g].iter().sum()
        };
        let mut best: Option<(f32, Vec<usize>)> = None;
        for mask in 0u32..(1 << groups) {
            if mask.count_ones() as usize != g {
                continue;
            }
            let chosen: Vec<usize> = (0..groups).filter(|i| mask >> i & 1 == 1).collect();
            let sum: f32 = chosen.iter().map(|&i| score(i)).sum();
            if best.as_ref().is_none_or(|(b, _)| sum > *b) {
                best = Some((sum, chosen));
            }
        }
        let chosen = best.map(|b| b.1).unwrap_or_default();
        let masked: Vec<f32> =
            (0..key.len()).map(|j| if chosen.contains(&(j / per)) { key[j] } else { f32::NEG_INFINITY }).collect();
        topk(&masked, k)
    }

    #[test]
    fn group_limited_selection_keeps_tokens_inside_the_best_groups() {
        // 8 experts in 4 groups of 2; plain top-4 takes experts 0, 2, 4, 6 (one per group),
        // group-limited (2 groups) must take both experts of groups 1 and 2.
        let key = [0.9, 0.0, 0.8, 0.7, 0.75, 0.7, 0.6, 0.1];
        assert_eq!(topk(&key, 4), vec![0, 2, 4, 3]);
        let mut limited = key;
        limit_groups(&mut limited, 4, 4, 2);
        assert_eq!(topk(&limited, 4), vec![2, 4, 3, 5]);
        // Random keys against the brute-force definition.
        let mut state = 12345u64;
        let mut rnd = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 40) as f32 / (1u64 << 24) as f32
        };
        for (e, groups, g, k) in [(8, 4, 2, 4), (16, 4, 2, 2), (12, 3, 1, 3), (16, 8, 4, 8)] {
            for _ in 0..200 {
                let key: Vec<f32> = (0..e).map(|_| rnd()).collect();
                let mut limited = key.clone();
                limit_groups(&mut limited, k, groups, g);
                assert_eq!(topk(&limited, k), brute_force(&key, k, groups, g), "{key:?}");
            }
        }
    }
}
