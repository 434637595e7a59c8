//! Token sampling with Megatron's semantics (SPEC §8.2 step 5): greedy for `top_k == 1`,
//! otherwise temperature, then top-k or top-p (nucleus, with the "shift right by one" rule
//! that keeps the first token crossing the threshold), then a seeded multinomial draw.
//!
//! Logits passed here are the true-vocabulary slice (padding rows excluded), so a sample is
//! always `< vocab_size` (Megatron clamps instead; the padded rows never win here).

use rand::Rng;

pub mod bench;
mod lazy;

/// The sampling knobs of one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// `0 < t`; divides the logits before top-k/top-p.
    pub temperature: f32,
    /// 0 = off, 1 = greedy, k > 1 = keep the k most likely tokens.
    pub top_k: usize,
    /// 0 = off; else keep the smallest set of most likely tokens whose mass reaches `top_p`.
    pub top_p: f32,
    /// After every generated token `top_p *= top_p_decay` (0 = off) ...
    pub top_p_decay: f32,
    /// ... but not below `top_p_bound`.
    pub top_p_bound: f32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 1.0, top_k: 0, top_p: 0.0, top_p_decay: 0.0, top_p_bound: 0.0 }
    }
}

impl SamplingParams {
    /// Greedy decoding (`top_k = 1`).
    pub fn greedy() -> SamplingParams {
        SamplingParams { top_k: 1, ..SamplingParams::default() }
    }

    /// The top-p to use after one more generated token (Megatron's `top_p_decay`/`bound`).
    pub fn decayed_top_p(&self, top_p: f32) -> f32 {
        if self.top_p_decay > 0.0 && top_p > 0.0 {
            (top_p * self.top_p_decay).max(self.top_p_bound)
        } else {
            top_p
        }
    }
}

/// Index of the largest logit (the lowest index among ties, like `torch.argmax` on CPU).
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best
}

/// `log_softmax(logits)[id]` in f64 accumulation.
pub fn log_prob(logits: &[f32], id: usize) -> f32 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let z: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    (logits[id] as f64 - max - z.ln()) as f32
}

/// The distribution a draw is made from: `(token, probability)` of every candidate, most
/// likely first, probabilities summing to 1. `top_p` is the current (possibly decayed) value.
pub fn candidates(logits: &[f32], params: &SamplingParams, top_p: f32) -> Vec<(usize, f64)> {
    if params.top_k > 1 && params.top_k < logits.len() && !logits.iter().any(|v| v.is_nan()) {
        return top_k_candidates(logits, params);
    }
    if params.top_k == 0 && top_p > 0.0 {
        if let Some(c) = lazy::top_p_candidates(logits, params, top_p) {
            return c;
        }
    }
    candidates_full_sort(logits, params, top_p)
}

/// The top-k case of [`candidates`] without sorting the whole vocabulary (a request's sampling
/// ran on the engine thread and sorted 50k logits per token): the k best by the same total
/// order (a selection, O(V)), the entries tied with the k-th, then a sort of those only. Same
/// tokens, order and probabilities as [`candidates_full_sort`], bit for bit (tested).
fn top_k_candidates(logits: &[f32], params: &SamplingParams) -> Vec<(usize, f64)> {
    let t = params.temperature as f64;
    let k = params.top_k;
    let cmp = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.select_nth_unstable_by(k - 1, cmp);
    // Megatron keeps the entries tied with the k-th largest (`v >= kth` after the temperature,
    // which also keeps a -0.0 tied with a +0.0 k-th).
    let kth = logits[order[k - 1]] as f64 / t;
    let mut keep: Vec<usize> = order[..k].to_vec();
    keep.extend(order[k..].iter().copied().filter(|&i| logits[i] as f64 / t >= kth));
    keep.sort_by(cmp);
    let scaled: Vec<f64> = keep.iter().map(|&i| logits[i] as f64 / t).collect();
    keep.into_iter().zip(softmax(&scaled)).collect()
}

/// [`candidates`] by a full sort of the vocabulary (top-p, no filter, NaN logits, and the
/// reference for [`top_k_candidates`]).
pub fn candidates_full_sort(logits: &[f32], params: &SamplingParams, top_p: f32) -> Vec<(usize, f64)> {
    let t = params.temperature as f64;
    let mut order: Vec<usize> = (0..logits.len()).collect();
    // Descending by logit; ties keep the lower id first (a stable order is part of determinism).
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let scaled: Vec<f64> = order.iter().map(|&i| logits[i] as f64 / t).collect();
    let probs = softmax(&scaled);
    let keep = if params.top_k > 1 {
        // Megatron masks logits below the k-th largest; ties with it survive.
        let kth = scaled[(params.top_k - 1).min(scaled.len() - 1)];
        scaled.iter().take_while(|&&v| v >= kth).count()
    } else if top_p > 0.0 {
        // Remove tokens whose cumulative probability exceeds p, shifted right by one: the token
        // that crosses p is kept, and the most likely token always is.
        let mut cum = 0.0;
        let mut n = 0;
        for &p in &probs {
            if n > 0 && cum > top_p as f64 {
                break;
            }
            cum += p;
            n += 1;
        }
        n
    } else {
        probs.len()
    };
    let kept = softmax(&scaled[..keep]);
    order.into_iter().take(keep).zip(kept).collect()
}

fn softmax(x: &[f64]) -> Vec<f64> {
    let max = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    if !max.is_finite() {
        // +inf (or all -inf / NaN) logits: `v - max` would be NaN. All the mass goes to the
        // first largest entry (the inputs are sorted, so that is the argmax): never NaN.
        return (0..x.len()).map(|i| if i == 0 { 1.0 } else { 0.0 }).collect();
    }
    let e: Vec<f64> = x.iter().map(|v| (v - max).exp()).collect();
    let z: f64 = e.iter().sum();
    e.into_iter().map(|v| v / z).collect()
}

/// One sample from `logits` (true vocabulary); `rng` is the request's seeded generator.
pub fn sample(logits: &[f32], params: &SamplingParams, top_p: f32, rng: &mut impl Rng) -> usize {
    if params.top_k == 1 {
        return argmax(logits);
    }
    if params.top_k == 0 && top_p <= 0.0 {
        // Plain temperature: walk only as far into the sorted vocabulary as the draw needs.
        let u: f64 = rng.gen::<f64>();
        return lazy::temperature_draw(logits, params, u)
            .unwrap_or_else(|| draw(&candidates_full_sort(logits, params, top_p), u));
    }
    let c = candidates(logits, params, top_p);
    draw(&c, rng.gen::<f64>())
}

/// [`sample`] by the full sort of the vocabulary for every setting (the reference the fast
/// paths are tested and benchmarked against; same rng use: one `f64` per token).
pub fn sample_full_sort(logits: &[f32], params: &SamplingParams, top_p: f32, rng: &mut impl Rng) -> usize {
    if params.top_k == 1 {
        return argmax(logits);
    }
    let c = candidates_full_sort(logits, params, top_p);
    draw(&c, rng.gen::<f64>())
}

/// The candidate whose cumulative probability first exceeds `u` (the multinomial draw).
fn draw(c: &[(usize, f64)], u: f64) -> usize {
    let mut cum = 0.0;
    for &(id, p) in c {
        cum += p;
        if u < cum {
            return id;
        }
    }
    c.last().map_or(0, |&(id, _)| id) // rounding left u ≥ Σp: the least likely candidate
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn top_k_by_selection_equals_the_full_sort_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for case in 0..300 {
            let v = [7usize, 50, 1000, 50257][case % 4];
            // Coarse values make many ties (with the k-th too), and ±0.0 both appear.
            let levels = [3.0f32, 17.0, 1000.0][case % 3];
            let logits: Vec<f32> = (0..v)
                .map(|_| {
                    let x = (rng.gen::<f32>() * levels).floor() / levels * 8.0 - 4.0;
                    if x == 0.0 && rng.gen::<bool>() {
                        -0.0
                    } else {
                        x
                    }
                })
                .collect();
            for (k, t) in [(2usize, 1.0f32), (5, 0.7), (40, 1.3), (v - 1, 1.0)] {
                let k = k.clamp(2, v - 1);
                let p = SamplingParams { temperature: t, top_k: k, ..SamplingParams::default() };
                let fast = candidates(&logits, &p, 0.0);
                let full = candidates_full_sort(&logits, &p, 0.0);
                assert_eq!(fast.len(), full.len(), "case {case} k {k}");
                for (a, b) in fast.iter().zip(&full) {
                    assert!(a.0 == b.0 && a.1.to_bits() == b.1.to_bits(), "case {case} k {k}: {a:?} vs {b:?}");
                }
            }
        }
    }

    fn logits() -> Vec<f32> {
        // softmax ≈ [0.0117, 0.0317, 0.0861, 0.2341, 0.6364] for ids 0..5 (ascending logits).
        vec![0.0, 1.0, 2.0, 3.0, 4.0]
    }

    #[test]
    fn greedy_is_argmax_and_ignores_the_rng() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..10 {
            assert_eq!(sample(&[0.1, 2.0, -1.0, 2.0], &SamplingParams::greedy(), 0.0, &mut rng), 1);
        }
    }

    #[test]
    fn top_k_keeps_exactly_k_candidates_renormalised() {
        let p = SamplingParams { top_k: 3, ..Default::default() };
        let c = candidates(&logits(), &p, 0.0);
        assert_eq!(c.iter().map(|x| x.0).collect::<Vec<_>>(), vec![4, 3, 2]);
        assert!((c.iter().map(|x| x.1).sum::<f64>() - 1.0).abs() < 1e-12);
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for _ in 0..200 {
            assert!(sample(&logits(), &p, 0.0, &mut rng) >= 2);
        }
    }

    #[test]
    fn top_p_keeps_the_token_that_crosses_the_threshold() {
        let p = SamplingParams { top_p: 0.5, ..Default::default() };
        // 0.636 > 0.5 already: only the top token.
        assert_eq!(candidates(&logits(), &p, 0.5).len(), 1);
        // 0.636 < 0.8 < 0.636 + 0.234: two tokens (the second crosses 0.8 and is kept).
        assert_eq!(candidates(&logits(), &p, 0.8).len(), 2);
        // 0.870 < 0.9 < 0.956: three tokens; their kept mass is ≥ p, dropping the last is < p.
        let c = candidates(&logits(), &p, 0.9);
        assert_eq!(c.iter().map(|x| x.0).collect::<Vec<_>>(), vec![4, 3, 2]);
        let full = softmax(&logits().iter().map(|&v| v as f64).collect::<Vec<_>>());
        let mass: f64 = c.iter().map(|x| full[x.0]).sum();
        let without_last: f64 = c[..c.len() - 1].iter().map(|x| full[x.0]).sum();
        assert!(mass >= 0.9 && without_last < 0.9, "{mass} {without_last}");
    }

    #[test]
    fn tiny_temperature_and_infinite_logits_stay_finite() {
        let p = SamplingParams { temperature: f32::MIN_POSITIVE, ..Default::default() };
        let c = candidates(&[1e30, -3e38, 2.0, 1e30 * 1.5], &p, 0.0);
        assert!(c.iter().all(|&(_, q)| q.is_finite()), "{c:?}");
        assert_eq!(c[0], (3, 1.0));
        let c = candidates(&[f32::INFINITY, 0.0, 1.0], &SamplingParams::default(), 0.0);
        assert_eq!((c[0], c[1].1, c[2].1), ((0, 1.0), 0.0, 0.0));
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        assert_eq!(sample(&[0.0, 5.0, 1.0], &p, 0.0, &mut rng), 1);
    }

    #[test]
    fn temperature_sharpens_and_flattens() {
        let cold = candidates(&logits(), &SamplingParams { temperature: 0.25, ..Default::default() }, 0.0);
        let hot = candidates(&logits(), &SamplingParams { temperature: 4.0, ..Default::default() }, 0.0);
        assert!(cold[0].1 > 0.98 && hot[0].1 < 0.4, "{} {}", cold[0].1, hot[0].1);
    }

    #[test]
    fn same_seed_same_samples_different_seed_different_samples() {
        let p = SamplingParams { temperature: 2.0, ..Default::default() };
        let draw = |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            (0..64).map(|_| sample(&logits(), &p, 0.0, &mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
    }

    #[test]
    fn sampling_frequencies_follow_the_distribution() {
        let p = SamplingParams::default();
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let n = 20000;
        let top = (0..n).filter(|_| sample(&logits(), &p, 0.0, &mut rng) == 4).count() as f64 / n as f64;
        assert!((top - 0.6364).abs() < 0.02, "frequency of the top token {top}");
    }

    #[test]
    fn top_p_decay_respects_the_bound() {
        let p = SamplingParams { top_p: 0.9, top_p_decay: 0.5, top_p_bound: 0.3, ..Default::default() };
        assert!((p.decayed_top_p(0.9) - 0.45).abs() < 1e-6);
        assert!((p.decayed_top_p(0.45) - 0.3).abs() < 1e-6);
    }

    #[test]
    fn log_prob_is_log_softmax() {
        let lp = log_prob(&logits(), 4);
        assert!((lp as f64 - 0.6364f64.ln()).abs() < 1e-3, "{lp}");
    }
}
