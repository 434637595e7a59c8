//! The BERT sample index (SPEC §2.11; Megatron's C++ `build_mapping`): `(first sentence,
//! end sentence (exclusive), target length)` triples over a split's documents, with target
//! lengths from `std::mt19937(seed)` and a Fisher–Yates shuffle by `std::mt19937_64(seed + 1)`.

use super::rng::Mt19937_64;
use crate::gpt::RandomState;
use anyhow::{bail, Result};

/// Sentences longer than this make a multi-sentence document unusable.
pub const LONG_SENTENCE_LEN: i32 = 512;

/// Inputs of [`build_sample_index`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleIndexSpec {
    /// Stop at the start of the first epoch with at least this many samples (`None`: one epoch).
    pub num_samples: Option<u64>,
    /// `sequence_length - 3` (room for `[CLS]` and two `[SEP]`).
    pub max_seq_length: i32,
    pub short_seq_prob: f64,
    pub seed: i32,
    /// 2 with the binary head, else 1.
    pub min_sentences: i64,
}

/// `get_target_sample_len`: `max_len`, or with probability `1/ratio` a length in `[2, max_len]`.
fn target_len(ratio: u64, max_len: i32, rng: &mut RandomState) -> i32 {
    if ratio == 0 {
        return max_len;
    }
    let r = u64::from(rng.next_u32());
    if r % ratio == 0 {
        (2 + r % (max_len as u64 - 1)) as i32
    } else {
        max_len
    }
}

/// Builds the shuffled `[n, 3]` sample index. `docs` are the split's sentence boundaries
/// (`document_indices[first_doc ..= end_doc]`), `sizes` every sentence's length.
pub fn build_sample_index(docs: &[i64], sizes: &[i32], spec: &SampleIndexSpec) -> Result<Vec<[u64; 3]>> {
    if spec.max_seq_length <= 1 {
        bail!("bert sample index: the sequence length must leave room for 2+ tokens besides [CLS]/[SEP]");
    }
    if !(0.0..=1.0).contains(&spec.short_seq_prob) {
        bail!("--short-seq-prob {} must be in [0, 1]", spec.short_seq_prob);
    }
    if docs.windows(2).any(|w| w[0] > w[1]) || docs.last().is_some_and(|&l| l as usize > sizes.len()) {
        bail!("bert sample index: document boundaries are not increasing within the {} sentences", sizes.len());
    }
    let ratio = if spec.short_seq_prob > 0.0 { (1.0 / spec.short_seq_prob).round() as u64 } else { 0 };
    let (epochs, max_samples) = match spec.num_samples {
        Some(n) => (i32::MAX as u64 - 1, n),
        None => (1, u64::MAX),
    };
    let mut rng = RandomState::new(spec.seed as u32);
    let mut maps: Vec<[u64; 3]> = Vec::new();
    for epoch in 0..epochs {
        if maps.len() as u64 >= max_samples {
            break;
        }
        if epoch == 1 && maps.is_empty() {
            bail!(
                "bert sample index: no document has >= {} sentences of <= {LONG_SENTENCE_LEN} tokens; \
                 preprocess with --split-sentences (or use --bert-no-binary-head)",
                spec.min_sentences
            );
        }
        for w in docs.windows(2) {
            let (first, last) = (w[0], w[1]);
            let mut remain = last - first;
            let long = remain > 1 && (first..last).any(|s| sizes[s as usize] > LONG_SENTENCE_LEN);
            if remain < spec.min_sentences || long {
                continue;
            }
            let (mut prev_start, mut seq_len, mut num_sent) = (first, 0i32, 0i64);
            let mut target = target_len(ratio, spec.max_seq_length, &mut rng);
            for s in first..last {
                seq_len += sizes[s as usize];
                num_sent += 1;
                remain -= 1;
                if (seq_len >= target && remain > 1 && num_sent >= spec.min_sentences) || remain == 0 {
                    maps.push([prev_start as u64, s as u64 + 1, target as u64]);
                    prev_start = s + 1;
                    target = target_len(ratio, spec.max_seq_length, &mut rng);
                    seq_len = 0;
                    num_sent = 0;
                }
            }
        }
    }
    let mut rng64 = Mt19937_64::new((spec.seed as i64 + 1) as u64);
    for i in (1..maps.len()).rev() {
        let j = (rng64.next_u64() % (i as u64 + 1)) as usize;
        maps.swap(i, j);
    }
    Ok(maps)
}
