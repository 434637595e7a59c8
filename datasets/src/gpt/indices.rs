//! The three index arrays of Megatron's `GPTDataset` (SPEC §2.6): the document index (the
//! split's sequences tiled over epochs and shuffled), the sample index (where each window of
//! `seq_length + 1` tokens starts and ends) and the shuffle index (the order samples are
//! served in). With the numpy-compatible [`RandomState`] they match Megatron's arrays (the
//! golden vector of SPEC §2.7 is a test below).

use super::random_state::RandomState;
use anyhow::bail;
use megatron_core::Result;

/// What the indices are built from.
#[derive(Clone, Copy, Debug)]
pub struct IndexSpec<'a> {
    /// Tokens per sequence of the whole low-level dataset.
    pub sizes: &'a [i32],
    /// The split's sequence indices (into `sizes`).
    pub indices: &'a [i32],
    /// `S`.
    pub seq_length: usize,
    /// Requested samples; `None` = one epoch.
    pub num_samples: Option<usize>,
    pub seed: u32,
    /// `x`: 1 when samples carry the extra label token (`add_extra_token_to_sequence`).
    pub add_extra_token: bool,
    /// Drop the last partial sample (always for train/test).
    pub drop_last_partial: bool,
}

/// Megatron's `document_index`, `sample_index` and `shuffle_index`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GptIndices {
    pub num_epochs: usize,
    pub separate_final_epoch: bool,
    /// Sequence ids, `indices` tiled `num_epochs` times and shuffled.
    pub document_index: Vec<i32>,
    /// `n + 1` rows of `(position in document_index, token offset)`; rows `j`, `j+1` bound
    /// sample `j`.
    pub sample_index: Vec<[i64; 2]>,
    /// Served order: sample `k` is `sample_index` window `shuffle_index[k]`.
    pub shuffle_index: Vec<u64>,
}

impl GptIndices {
    /// Number of samples `n`.
    pub fn len(&self) -> usize {
        self.shuffle_index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.shuffle_index.is_empty()
    }
}

/// `indices` tiled `epochs` times and shuffled in place (`_build_document_index`).
fn tiled_shuffled(indices: &[i32], epochs: usize, rng: &mut RandomState) -> Vec<i32> {
    let mut doc: Vec<i32> = Vec::with_capacity(indices.len() * epochs);
    for _ in 0..epochs {
        doc.extend_from_slice(indices);
    }
    rng.shuffle(&mut doc);
    doc
}

/// The sample index, transcribed from the C++ helper `build_sample_idx`.
fn sample_index(sizes: &[i32], doc_idx: &[i32], s: i64, x: i64, n: usize) -> Vec<[i64; 2]> {
    let size = |i: usize| i64::from(sizes[doc_idx[i] as usize]);
    let mut rows = Vec::with_capacity(n + 1);
    rows.push([0, 0]);
    let (mut i, mut off) = (0usize, 0i64);
    while rows.len() <= n {
        let mut need = s + x;
        while need != 0 {
            let dl = size(i) - off;
            need -= dl;
            if need <= 0 {
                // The sample ends inside this document.
                off += need + dl - x;
                need = 0;
            } else {
                if i == doc_idx.len() - 1 {
                    // Out of documents: only the last (partial) sample gets here.
                    off = size(i) - x;
                    break;
                }
                i += 1;
                off = 0;
            }
        }
        rows.push([i as i64, off]);
    }
    rows
}

/// The epoch arithmetic of SPEC §2.6, without building anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpochPlan {
    pub tokens_per_epoch: u64,
    pub num_epochs: usize,
    pub separate_final_epoch: bool,
    /// Samples of the epochs before a separate final epoch.
    pub n_before: u64,
    /// Number of samples `n`.
    pub num_samples: usize,
}

/// `_get_num_epochs` and the separate-final-epoch rule for `spec`.
pub fn epoch_plan(spec: &IndexSpec) -> Result<EpochPlan> {
    let s = spec.seq_length as u64;
    let x = u64::from(spec.add_extra_token);
    if s == 0 {
        bail!("seq_length must be at least 1");
    }
    if let Some(&bad) = spec.indices.iter().find(|&&i| i < 0 || i as usize >= spec.sizes.len()) {
        bail!("sequence index {bad} is outside the dataset's {} sequences", spec.sizes.len());
    }
    let tokens_per_epoch: u64 = spec.indices.iter().map(|&i| spec.sizes[i as usize] as u64).sum();
    if tokens_per_epoch <= x {
        bail!("the split has {tokens_per_epoch} tokens, too few to form a sample of {} tokens", s + x);
    }
    let num_epochs = match spec.num_samples {
        None => 1,
        Some(ns) => (ns as u64 * s + x).div_ceil(tokens_per_epoch).max(1) as usize,
    };
    let e = num_epochs as u64;

    let mut separate_final_epoch = false;
    let mut n_before = 0u64;
    if let (Some(ns), true) = (spec.num_samples, num_epochs > 1) {
        n_before = ((e - 1) * tokens_per_epoch - x) / s;
        let n_last = ns as u64 - n_before;
        let n_epoch = (tokens_per_epoch - x) / s;
        // Python's `int(0.80 * n)` truncates, as does the cast.
        separate_final_epoch = n_last < (0.80 * n_epoch as f64) as u64;
    }
    let total = e * tokens_per_epoch - x;
    let num_samples = if spec.drop_last_partial { total / s } else { total.div_ceil(s) } as usize;
    Ok(EpochPlan { tokens_per_epoch, num_epochs, separate_final_epoch, n_before, num_samples })
}

/// Builds all three indices as Megatron's `_build_document_sample_shuffle_indices` does.
pub fn build_indices(spec: &IndexSpec) -> Result<GptIndices> {
    let plan = epoch_plan(spec)?;
    let EpochPlan { num_epochs, separate_final_epoch, n_before, num_samples: n, .. } = plan;
    let (s, x) = (spec.seq_length as i64, i64::from(spec.add_extra_token));
    let mut rng = RandomState::new(spec.seed);
    let document_index = if separate_final_epoch {
        let mut first = tiled_shuffled(spec.indices, num_epochs - 1, &mut rng);
        first.extend(tiled_shuffled(spec.indices, 1, &mut rng));
        first
    } else {
        tiled_shuffled(spec.indices, num_epochs, &mut rng)
    };

    let sample_index = sample_index(spec.sizes, &document_index, s, x, n);

    let mut shuffle_index: Vec<u64> = (0..n as u64).collect();
    if separate_final_epoch {
        let (head, tail) = shuffle_index.split_at_mut(n_before as usize);
        rng.shuffle(head);
        rng.shuffle(tail);
    } else {
        rng.shuffle(&mut shuffle_index);
    }
    Ok(GptIndices { num_epochs, separate_final_epoch, document_index, sample_index, shuffle_index })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec<'a>(sizes: &'a [i32], indices: &'a [i32], num_samples: Option<usize>) -> IndexSpec<'a> {
        IndexSpec {
            sizes,
            indices,
            seq_length: 4,
            num_samples,
            seed: 1234,
            add_extra_token: true,
            drop_last_partial: true,
        }
    }

    #[test]
    fn golden_vector_of_spec_2_7() -> Result<()> {
        let got = build_indices(&spec(&[5, 3, 7, 2, 6], &[0, 1, 2, 3, 4], Some(10)))?;
        assert_eq!((got.num_epochs, got.separate_final_epoch), (2, false));
        assert_eq!(got.document_index, [2, 2, 4, 1, 0, 3, 4, 0, 1, 3]);
        let want: Vec<[i64; 2]> =
            vec![[0, 0], [0, 4], [1, 1], [1, 5], [2, 2], [3, 0], [4, 1], [5, 0], [6, 2], [7, 0], [7, 4], [9, 0]];
        assert_eq!(got.sample_index, want);
        assert_eq!(got.shuffle_index, [3, 10, 2, 1, 7, 5, 4, 0, 8, 6, 9]);
        Ok(())
    }

    #[test]
    fn separate_final_epoch_shuffles_the_tail_on_its_own() -> Result<()> {
        // 23 tokens/epoch → 5 samples/epoch; 6 samples need 2 epochs, and the 1 sample taken
        // from the second epoch is below 0.8 × 5, so the final epoch is separate.
        let got = build_indices(&spec(&[5, 3, 7, 2, 6], &[0, 1, 2, 3, 4], Some(6)))?;
        assert_eq!((got.num_epochs, got.separate_final_epoch), (2, true));
        let mut first_epoch = got.document_index[..5].to_vec();
        first_epoch.sort();
        assert_eq!(first_epoch, [0, 1, 2, 3, 4]);
        let n_before = 5;
        assert!(got.shuffle_index[..n_before].iter().all(|&j| j < n_before as u64));
        assert!(got.shuffle_index[n_before..].iter().all(|&j| j >= n_before as u64));
        assert!(got.len() >= 6);
        Ok(())
    }

    #[test]
    fn keeping_the_partial_sample_adds_one_and_empty_splits_fail() -> Result<()> {
        let mut sp = spec(&[5, 3, 7, 2, 6], &[0, 1, 2, 3, 4], None);
        assert_eq!(build_indices(&sp)?.len(), 5); // (23 - 1) / 4
        sp.drop_last_partial = false;
        let keep = build_indices(&sp)?;
        assert_eq!(keep.len(), 6);
        // The partial sample ends at the last token of the last document.
        let last_doc = [5i64, 3, 7, 2, 6][keep.document_index[4] as usize];
        assert_eq!(keep.sample_index.last(), Some(&[4, last_doc - 1]));
        assert!(build_indices(&spec(&[0, 1], &[0, 1], None)).is_err());
        assert!(build_indices(&spec(&[3], &[1], None)).is_err());
        Ok(())
    }
}
