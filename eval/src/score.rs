//! Per-target scores from vocab-parallel logits. Each TP rank holds the logits of its vocab
//! slice `[start, start + V/tp)`; for every scored position it reduces its slice to a
//! [`SliceStats`] (max, first argmax, `Σ exp(x - max)`, the target's logit when the target is
//! in the slice), and [`combine`] merges the ranks in rank order into the cross entropy and the
//! argmax over the whole vocabulary. The same code runs at tp = 1 (one slice), and the merge
//! order is fixed, so results do not depend on thread timing.

/// One rank's reduction of its logits slice at the scored positions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SliceStats {
    pub max: Vec<f32>,
    /// Global vocab id of the first maximum in the slice.
    pub argmax: Vec<u32>,
    /// `Σ exp(x - max)` over the slice (f64).
    pub sum_exp: Vec<f64>,
    /// The target's logit, `None` when the target is outside this slice.
    pub target: Vec<Option<f32>>,
}

/// Reduces `logits` (`positions.len()`-independent layout `(rows, v_local)`) at `positions`
/// with targets `labels[p]`. Ids `>= vocab_size` (vocabulary padding) are ignored.
pub fn slice_stats(
    logits: &[f32],
    v_local: usize,
    vocab_start: usize,
    vocab_size: usize,
    positions: &[usize],
    labels: &[i32],
) -> SliceStats {
    let live = vocab_size.saturating_sub(vocab_start).min(v_local);
    let mut st = SliceStats::default();
    for &p in positions {
        let row = &logits[p * v_local..p * v_local + live];
        let (mut best, mut arg) = (f32::NEG_INFINITY, 0usize);
        for (i, &x) in row.iter().enumerate() {
            if x > best {
                best = x;
                arg = i;
            }
        }
        let sum: f64 =
            if best == f32::NEG_INFINITY { 0.0 } else { row.iter().map(|&x| ((x - best) as f64).exp()).sum() };
        let t = labels[p] as i64 - vocab_start as i64;
        st.max.push(best);
        st.argmax.push((vocab_start + arg) as u32);
        st.sum_exp.push(sum);
        st.target.push((t >= 0 && (t as usize) < live).then(|| row[t as usize]));
    }
    st
}

/// Score of one target token over the whole vocabulary.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenScore {
    /// `-log p(target)`.
    pub nll: f64,
    /// The model's top prediction (first maximum, lowest id on ties).
    pub argmax: u32,
}

/// Merges the slices of all TP ranks (in rank order) position by position.
pub fn combine(slices: &[SliceStats]) -> Vec<TokenScore> {
    let n = slices.first().map_or(0, |s| s.max.len());
    (0..n)
        .map(|i| {
            let (mut gmax, mut arg) = (f32::NEG_INFINITY, 0u32);
            for s in slices {
                if s.max[i] > gmax {
                    gmax = s.max[i];
                    arg = s.argmax[i];
                }
            }
            let total: f64 = slices.iter().map(|s| s.sum_exp[i] * ((s.max[i] - gmax) as f64).exp()).sum();
            let target = slices.iter().find_map(|s| s.target[i]);
            let nll = match target {
                Some(t) => total.ln() + gmax as f64 - t as f64,
                None => f64::INFINITY, // the target is vocabulary padding: probability 0
            };
            TokenScore { nll, argmax: arg }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Naive reference: log-softmax over the whole row in f64.
    fn naive(row: &[f32], target: usize) -> (f64, u32) {
        let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let z: f64 = row.iter().map(|&x| (x as f64 - m).exp()).sum();
        let arg = row.iter().position(|&x| x as f64 == m).unwrap() as u32;
        (z.ln() + m - row[target] as f64, arg)
    }

    #[test]
    fn split_slices_match_the_whole_row() {
        let v = 12;
        let rows = 3;
        let logits: Vec<f32> = (0..rows * v).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.7).collect();
        let labels = [5, 0, 11];
        let positions = [0, 1, 2];
        let whole = combine(&[slice_stats(&logits, v, 0, v, &positions, &labels)]);
        for tp in [2, 3, 4] {
            let vl = v / tp;
            let slices: Vec<SliceStats> = (0..tp)
                .map(|r| {
                    let local: Vec<f32> =
                        (0..rows).flat_map(|p| logits[p * v + r * vl..p * v + (r + 1) * vl].to_vec()).collect();
                    slice_stats(&local, vl, r * vl, v, &positions, &labels)
                })
                .collect();
            let split = combine(&slices);
            for p in 0..rows {
                let (nll, arg) = naive(&logits[p * v..(p + 1) * v], labels[p] as usize);
                assert!((whole[p].nll - nll).abs() < 1e-9, "tp1 {} vs naive {nll}", whole[p].nll);
                assert!((split[p].nll - nll).abs() < 1e-9, "tp{tp} {} vs naive {nll}", split[p].nll);
                assert_eq!((whole[p].argmax, split[p].argmax), (arg, arg));
            }
        }
    }

    #[test]
    fn padding_ids_are_ignored_and_ties_take_the_lowest_id() {
        // V_padded 4, vocab 3: the padded id 3 has the largest logit but must not count.
        let logits = [1.0f32, 2.0, 2.0, 9.0];
        let s = combine(&[slice_stats(&logits, 4, 0, 3, &[0], &[1])]);
        assert_eq!(s[0].argmax, 1);
        let want = (1f64.exp() + 2.0 * 2f64.exp()).ln() - 2.0;
        assert!((s[0].nll - want).abs() < 1e-9);
    }
}
