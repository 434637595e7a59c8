//! Megatron's `T5MaskedWordPieceDataset` (SPEC §2.12): span-corruption samples from a
//! sentence-split `.bin`/`.idx` prefix (BERT WordPiece ids with sentinels,
//! `--vocab-extra-ids`). [`sample_index`] is the masked-LM sample index (shared in algorithm
//! with BERT, §2.11), [`masking`] the span masking and sample assembly, [`rng`] the C++ and
//! numpy random streams they draw from, so samples equal Megatron's for the same files and
//! seed (`datasets/tests/t5_dataset.rs` checks them against Megatron-Core's own code).
//!
//! [`T5Dataset`] implements [`Dataset`] with the packed layout the `t5` model reads
//! (`models/t5/src/batch.rs`): `tokens = [text_enc | text_dec]`,
//! `labels = [0 … | labels (−1 → 0)]`, `loss_mask = [enc_mask | loss_mask]`.

pub mod masking;
pub mod plugin;
pub mod rng;
pub mod sample_index;

pub use masking::{T5Sample, T5Vocab};

use crate::gpt::RandomState;
use crate::indexed::IndexedDataset;
use anyhow::{bail, Context, Result};
use megatron_core::{Dataset, Sample};
use std::ops::Range;
use std::sync::Arc;

/// `pretrain_t5.py`'s dataset settings.
#[derive(Clone, Debug, PartialEq)]
pub struct T5DatasetConfig {
    /// `--encoder-seq-length`.
    pub encoder_seq_length: usize,
    /// `--decoder-seq-length`.
    pub decoder_seq_length: usize,
    /// `--seed`.
    pub seed: i32,
    /// `--mask-prob` (0.15).
    pub masking_probability: f64,
    /// `--short-seq-prob` (0.1).
    pub short_seq_prob: f64,
    /// 10 in `pretrain_t5.py`.
    pub max_ngram: usize,
    /// Samples to index (the epochs repeat until there are at least this many).
    pub num_samples: u64,
}

impl T5DatasetConfig {
    pub fn new(encoder_seq_length: usize, decoder_seq_length: usize, seed: i32, num_samples: u64) -> T5DatasetConfig {
        T5DatasetConfig {
            encoder_seq_length,
            decoder_seq_length,
            seed,
            masking_probability: 0.15,
            short_seq_prob: 0.1,
            max_ngram: 10,
            num_samples,
        }
    }
}

pub struct T5Dataset {
    data: Arc<IndexedDataset>,
    config: T5DatasetConfig,
    vocab: Arc<T5Vocab>,
    index: Vec<[u64; 3]>,
}

impl T5Dataset {
    /// The dataset over documents `docs` of `data` (a split's document range).
    pub fn new(
        data: Arc<IndexedDataset>,
        docs: Range<usize>,
        vocab: Arc<T5Vocab>,
        config: T5DatasetConfig,
    ) -> Result<T5Dataset> {
        let di = data.document_indices();
        if docs.is_empty() || docs.end >= di.len() {
            bail!(
                "t5 dataset {}: document range {docs:?} is empty or beyond its {} documents",
                data.prefix().display(),
                di.len() - 1
            );
        }
        if vocab.sentinels.is_empty() {
            bail!("t5 dataset: the tokenizer has no sentinel tokens; set --vocab-extra-ids 100");
        }
        let index = sample_index::build_mapping(
            &di[docs.start..=docs.end],
            data.sequence_lengths(),
            config.num_samples,
            config.encoder_seq_length as i32 - 2,
            config.short_seq_prob,
            config.seed,
            1,
        )
        .with_context(|| format!("t5 dataset {}", data.prefix().display()))?;
        Ok(T5Dataset { data, config, vocab, index })
    }

    pub fn sample_index(&self) -> &[[u64; 3]] {
        &self.index
    }

    /// Megatron's sample `idx`.
    pub fn sample(&self, idx: usize) -> Result<T5Sample> {
        let Some(&[beg, end, target]) = self.index.get(idx) else {
            bail!("t5 dataset: sample {idx} out of range ({} samples)", self.index.len());
        };
        let mut tokens = Vec::new();
        for s in beg..end {
            tokens.extend(self.data.sequence(s as usize)?);
        }
        let target = target as usize;
        let truncated = tokens.len() > target;
        tokens.truncate(target);
        let seed = (self.config.seed as i64 + idx as i64).rem_euclid(1 << 32) as u32;
        let mut rng = RandomState::new(seed);
        let c = &self.config;
        let spans = masking::masked_spans(&tokens, target, &self.vocab, c.masking_probability, c.max_ngram, &mut rng);
        masking::build_sample(&tokens, &spans, &self.vocab, c.encoder_seq_length, c.decoder_seq_length, truncated)
            .ok_or_else(|| {
                anyhow::anyhow!(
                "t5 sample {idx}: {} spans do not fit --encoder-seq-length {} / --decoder-seq-length {} (or there are \
                 fewer sentinels than spans: --vocab-extra-ids); raise --decoder-seq-length",
                spans.len(),
                c.encoder_seq_length,
                c.decoder_seq_length
            )
            })
    }
}

impl Dataset for T5Dataset {
    fn name(&self) -> &str {
        "t5"
    }
    fn len(&self) -> usize {
        self.index.len()
    }
    fn get(&self, index: usize) -> Result<Sample> {
        let s = self.sample(index)?;
        let i32s = |v: &[i64]| v.iter().map(|&x| x as i32).collect::<Vec<_>>();
        let tokens = i32s(&s.text_enc).into_iter().chain(i32s(&s.text_dec)).collect();
        let labels =
            std::iter::repeat_n(0, s.text_enc.len()).chain(s.labels.iter().map(|&l| l.max(0) as i32)).collect();
        let loss_mask = s.enc_mask.iter().chain(&s.loss_mask).map(|&m| m as f32).collect();
        Ok(Sample { tokens, labels, loss_mask })
    }
}
