//! Top-p and plain-temperature sampling without sorting the whole vocabulary, giving the same
//! tokens and probabilities as [`super::candidates_full_sort`] bit for bit.
//!
//! The full-sort path sorts all V logits, computes `softmax` over all of them (its normaliser
//! `z` summed in sorted order), then walks the cumulative probabilities in sorted order: to the
//! first one above `top_p` (nucleus), or to the first one above the draw `u` (plain
//! temperature). Only that walked prefix matters, and for a trained model it is short. Here the
//! prefix of the same total order is produced by a growing partial selection (select the next
//! chunk, sort only it), and the walk runs over it with the same per-token terms `e_i / z`.
//!
//! The one thing that differs is the order in which `z` is summed (token-id order here, sorted
//! order there), so `z` may differ in its last bits, and so may each cumulative sum `c`. Both
//! sums have V terms of the same sign: each is within `γ_V·z` (`γ_V = Vε/(1-Vε)`, 5.6e-12 for
//! V = 50257) of the exact one, so the terms `e_i/z` differ by at most ~1.2e-11 relatively and
//! the walks' sums by at most ~2.5e-11 (all of them ≤ 1 + tiny). A decision `c > top_p` or
//! `u < c` is therefore the same in both unless `|c - threshold| ≤ 2.5e-11`; we require a
//! margin of [`MARGIN`] (40x that), and when a comparison falls inside it (probability ~1e-9
//! per token) we return `None` and the caller takes the full-sort path. The kept candidates'
//! renormalised probabilities are a softmax over the kept prefix only, in sorted order: the
//! same computation as the full-sort path's, so the same bits.

use super::{softmax, SamplingParams};

/// A cumulative probability this close to its threshold is decided by the full sort.
const MARGIN: f64 = 1e-9;
/// First prefix sorted, and its growth factor.
const FIRST: usize = 64;
const GROWTH: usize = 4;

/// `exp(logit/t - max)` of every token (indexed by id) and their sum in id order.
struct Weights {
    e: Vec<f64>,
    z: f64,
}

impl Weights {
    /// `None` for logits whose scaled values are not all finite (the full-sort path's special
    /// cases: NaN and ±inf logits; f32 logits over an f32 temperature stay finite in f64).
    fn new(logits: &[f32], t: f64) -> Option<Weights> {
        let mut max = f64::NEG_INFINITY;
        for &v in logits {
            let s = v as f64 / t;
            if !s.is_finite() {
                return None;
            }
            max = max.max(s);
        }
        // The same expression as `softmax` on the sorted scaled logits: identical terms.
        let e: Vec<f64> = logits.iter().map(|&v| (v as f64 / t - max).exp()).collect();
        let z = e.iter().sum();
        Some(Weights { e, z })
    }
}

/// The vocabulary in the full sort's order (logit descending, lower id first among ties),
/// materialised a growing prefix at a time.
struct Prefix<'a> {
    logits: &'a [f32],
    order: Vec<usize>,
    sorted: usize,
}

impl<'a> Prefix<'a> {
    fn new(logits: &'a [f32]) -> Self {
        Prefix { logits, order: (0..logits.len()).collect(), sorted: 0 }
    }

    /// Sorts the next entries so that at least `m` (or all) lead `order`; returns the range of
    /// the newly sorted ones. `order[sorted..]` always holds exactly the tokens ranked below
    /// the sorted prefix, so selecting within it gives the next ones of the total order.
    fn grow(&mut self, m: usize) -> std::ops::Range<usize> {
        let logits = self.logits;
        let cmp = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
        let (from, to) = (self.sorted, m.min(self.order.len()));
        if to > from {
            let rest = &mut self.order[from..];
            let k = to - from;
            if k < rest.len() {
                rest.select_nth_unstable_by(k - 1, cmp);
            }
            rest[..k].sort_by(cmp);
            self.sorted = to;
        }
        from..self.sorted
    }

    fn done(&self) -> bool {
        self.sorted == self.order.len()
    }
}

/// The next prefix length: x[`GROWTH`], or the whole vocabulary once that passes a quarter of
/// it (a flat distribution's nucleus is most of the vocabulary: one sort of the rest is then
/// cheaper than more rounds of selection).
fn next_size(m: usize, v: usize) -> usize {
    let next = m.saturating_mul(GROWTH);
    if next >= v / 4 {
        v
    } else {
        next
    }
}

/// The nucleus candidates of [`super::candidates_full_sort`] (top-k off, `top_p > 0`), or
/// `None` when the full sort must decide.
pub(super) fn top_p_candidates(logits: &[f32], params: &SamplingParams, top_p: f32) -> Option<Vec<(usize, f64)>> {
    let t = params.temperature as f64;
    let w = Weights::new(logits, t)?;
    let p = top_p as f64;
    let mut prefix = Prefix::new(logits);
    let (mut cum, mut n, mut m) = (0.0f64, 0usize, FIRST);
    'walk: loop {
        let new = prefix.grow(m);
        for &i in &prefix.order[new] {
            // The full sort's rule: stop before the token after the one that crossed p.
            if n > 0 {
                if (cum - p).abs() <= MARGIN {
                    return None;
                }
                if cum > p {
                    break 'walk;
                }
            }
            cum += w.e[i] / w.z;
            n += 1;
        }
        if prefix.done() {
            break;
        }
        m = next_size(m, logits.len());
    }
    let kept = &prefix.order[..n];
    let scaled: Vec<f64> = kept.iter().map(|&i| logits[i] as f64 / t).collect();
    Some(kept.iter().copied().zip(softmax(&scaled)).collect())
}

/// The token a draw `u` picks from plain-temperature sampling (no top-k, no top-p) — the
/// full sort's walk `Σ p_i > u` — or `None` when the full sort must decide.
pub(super) fn temperature_draw(logits: &[f32], params: &SamplingParams, u: f64) -> Option<usize> {
    let w = Weights::new(logits, params.temperature as f64)?;
    let mut prefix = Prefix::new(logits);
    let (mut cum, mut m) = (0.0f64, FIRST);
    loop {
        let new = prefix.grow(m);
        for &i in &prefix.order[new] {
            cum += w.e[i] / w.z;
            if (u - cum).abs() <= MARGIN {
                return None;
            }
            if u < cum {
                return Some(i);
            }
        }
        if prefix.done() {
            // Rounding left u ≥ Σp: the least likely token, as the full-sort path does.
            return prefix.order.last().copied();
        }
        m = next_size(m, logits.len());
    }
}

#[cfg(test)]
mod tests {
    use super::super::{candidates, candidates_full_sort, draw, sample, sample_full_sort};
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Random logits from flat (untrained) to peaked (trained), with ties and ±0.0.
    fn random_logits(rng: &mut ChaCha8Rng, v: usize, case: usize) -> Vec<f32> {
        let scale = [0.05f32, 1.0, 4.0, 12.0][case % 4];
        let coarse = case.is_multiple_of(3);
        (0..v)
            .map(|_| {
                let x = (rng.gen::<f32>() - 0.5) * 2.0 * scale;
                let x = if coarse { (x * 4.0).round() / 4.0 } else { x };
                if x == 0.0 && rng.gen::<bool>() {
                    -0.0
                } else {
                    x
                }
            })
            .collect()
    }

    fn same(a: &[(usize, f64)], b: &[(usize, f64)]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.0 == y.0 && x.1.to_bits() == y.1.to_bits())
    }

    #[test]
    fn top_p_by_growing_selection_equals_the_full_sort_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let (mut fast, mut total) = (0, 0);
        for case in 0..48 {
            let v = [3usize, 100, 5000, 50257][case % 4];
            let logits = random_logits(&mut rng, v, case / 4);
            for (top_p, t) in [(0.1f32, 1.0f32), (0.5, 0.7), (0.9, 1.0), (0.95, 1.3), (0.999, 0.5)] {
                let p = SamplingParams { temperature: t, top_p, ..SamplingParams::default() };
                let full = candidates_full_sort(&logits, &p, top_p);
                total += 1;
                if let Some(c) = top_p_candidates(&logits, &p, top_p) {
                    fast += 1;
                    assert!(same(&c, &full), "case {case} v {v} top_p {top_p} t {t}: {} vs {}", c.len(), full.len());
                }
                assert!(same(&candidates(&logits, &p, top_p), &full), "case {case}");
            }
        }
        // The fast path decides (the margin fallback is for near-ties with the threshold only).
        assert!(fast * 100 >= total * 95, "fast path taken {fast} of {total}");
    }

    #[test]
    fn temperature_draw_equals_the_full_sort_draw() {
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        let (mut fast, mut total) = (0, 0);
        for case in 0..32 {
            let v = [2usize, 100, 5000, 50257][case % 4];
            let logits = random_logits(&mut rng, v, case / 4);
            let p = SamplingParams { temperature: [1.0f32, 0.6, 1.7][case % 3], ..SamplingParams::default() };
            let full = candidates_full_sort(&logits, &p, 0.0);
            for _ in 0..20 {
                let u: f64 = rng.gen();
                total += 1;
                if let Some(id) = temperature_draw(&logits, &p, u) {
                    fast += 1;
                    assert_eq!(id, draw(&full, u), "case {case} v {v} u {u}");
                }
            }
            // Through `sample` with per-request seeds: the same tokens as the full-sort sampler.
            let (mut a, mut b) = (ChaCha8Rng::seed_from_u64(case as u64), ChaCha8Rng::seed_from_u64(case as u64));
            for _ in 0..10 {
                assert_eq!(sample(&logits, &p, 0.0, &mut a), sample_full_sort(&logits, &p, 0.0, &mut b));
            }
        }
        assert!(fast * 100 >= total * 95, "fast path taken {fast} of {total}");
    }

    #[test]
    fn a_cumulative_sum_at_the_threshold_goes_to_the_full_sort() {
        // Two equal logits: after the first token the mass is exactly 0.5.
        let p = SamplingParams { top_p: 0.5, ..SamplingParams::default() };
        assert!(top_p_candidates(&[1.0, 1.0], &p, 0.5).is_none());
        assert!(same(&candidates(&[1.0, 1.0], &p, 0.5), &candidates_full_sort(&[1.0, 1.0], &p, 0.5)));
        assert!(temperature_draw(&[1.0, 1.0], &SamplingParams::default(), 0.5).is_none());
        // Non-finite scaled logits are the full sort's special cases.
        assert!(top_p_candidates(&[f32::INFINITY, 0.0], &p, 0.5).is_none());
        let tiny = SamplingParams { temperature: f32::MIN_POSITIVE, top_p: 0.5, ..SamplingParams::default() };
        let big = [1e30, 0.0, -3e38, 2e30];
        assert!(same(&top_p_candidates(&big, &tiny, 0.5).unwrap(), &candidates_full_sort(&big, &tiny, 0.5)));
    }
}
