//! The `bert` dataset plugin (`megatron pretrain --model bert`): one sentence-split
//! `.bin`/`.idx` prefix (`--data-path`), split by documents with `--split`, each split a
//! [`BertMaskedDataset`] of Megatron's samples, handed to the training loop as generic
//! [`Sample`]s in the packed layout below (the `bert` model unpacks it,
//! `models/bert/src/batch.rs`; the generic sample has only tokens, labels and a loss mask, so
//! BERT's extra fields ride in a second half, as the `t5` dataset does with its decoder).
//!
//! Packed layout of a sample of `--seq-length s` (every vector has `2s` entries):
//! * `tokens    = [text (s) | types (s)]`
//! * `labels    = [labels, −1 → 0 (s) | is_random, 0 × (s − 1)]`
//! * `loss_mask = [loss_mask (s) | padding_mask as 1.0 / 0.0 (s)]`

use super::{masking_vocab_from_file, BertDatasetConfig, BertMaskedDataset, BertSample};
use crate::indexed::IndexedDataset;
use crate::split::split_ranges;
use anyhow::{bail, Context, Result};
use megatron_core::{Dataset, DatasetSplits, Sample};
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;

pub const NAME: &str = "bert";

fn default_split() -> String {
    "969, 30, 1".to_string()
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BertPluginConfig {
    /// One prefix (`--data-path PREFIX`); blends are not supported for BERT yet.
    pub data_path: Vec<String>,
    #[serde(default = "default_split")]
    pub split: String,
    /// The BERT `vocab.txt` (word-continuation `##` pieces, `[CLS]`, `[SEP]`, `[MASK]`, `[PAD]`).
    pub vocab_file: PathBuf,
    /// `--seq-length`.
    pub seq_length: usize,
    pub seed: u32,
    /// `--mask-prob`.
    pub mask_prob: f64,
    /// `--short-seq-prob`.
    pub short_seq_prob: f64,
    /// The sentence-order head (`--bert-no-binary-head` turns it off).
    pub binary_head: bool,
    /// Samples wanted per split (train, valid, test).
    pub num_samples: [u64; 3],
}

/// [`BertMaskedDataset`] as a generic [`Dataset`] of packed samples (module docs).
pub struct PackedBertDataset(pub BertMaskedDataset);

/// A [`BertSample`] in the packed layout (module docs).
pub fn pack(s: &BertSample) -> Sample {
    let n = s.text.len();
    let tokens = s.text.iter().chain(&s.types).map(|&t| t as i32).collect();
    let mut labels: Vec<i32> = s.labels.iter().map(|&l| l.max(0) as i32).collect();
    labels.push(s.is_random as i32);
    labels.resize(2 * n, 0);
    let loss_mask = s
        .loss_mask
        .iter()
        .map(|&m| m as f32)
        .chain(s.padding_mask.iter().map(|&m| if m == 1 { 1.0 } else { 0.0 }))
        .collect();
    Sample { tokens, labels, loss_mask }
}

impl Dataset for PackedBertDataset {
    fn name(&self) -> &str {
        NAME
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn get(&self, index: usize) -> Result<Sample> {
        Ok(pack(&self.0.get(index)?))
    }
}

/// Builds the splits; `tokenizer` (the run's) must use the same vocabulary file.
pub fn build_bert_splits(
    c: &BertPluginConfig,
    tokenizer: Option<&dyn megatron_core::Tokenizer>,
) -> Result<DatasetSplits> {
    let [prefix] = c.data_path.as_slice() else {
        bail!(
            "the bert dataset takes one --data-path prefix (got {:?}); blends are not supported for BERT yet",
            c.data_path
        );
    };
    let vocab = masking_vocab_from_file(&c.vocab_file).context("--vocab-file")?;
    let vocab_len = vocab.is_subword.len();
    let text = std::fs::read_to_string(&c.vocab_file)
        .with_context(|| format!("reading --vocab-file {}", c.vocab_file.display()))?;
    let pad_id = text.lines().position(|w| w == "[PAD]").with_context(|| {
        format!("--vocab-file {} has no [PAD] token (BERT needs a WordPiece vocabulary)", c.vocab_file.display())
    })? as i64;
    if let Some(t) = tokenizer {
        let sp = t.special_ids();
        // Megatron's BERT tokenizers append [BOS] and [EOS] to the file's vocabulary.
        if t.vocab_size() < vocab_len || sp.mask.map(i64::from) != Some(vocab.mask) {
            bail!(
                "the bert dataset needs a BERT WordPiece tokenizer (--tokenizer-type BertWordPieceLowerCase or \
                 BertWordPieceCase) over --vocab-file {} ({vocab_len} ids); tokenizer `{}` has {} ids and [MASK] = {:?}",
                c.vocab_file.display(),
                t.name(),
                t.vocab_size(),
                sp.mask
            );
        }
    }
    let data = IndexedDataset::open(prefix).with_context(|| format!("opening --data-path {prefix}"))?;
    let ranges = split_ranges(&c.split, data.num_documents())?;
    let mut out: [Option<Arc<dyn Dataset>>; 3] = [None, None, None];
    for (k, r) in ranges.into_iter().enumerate() {
        let Some(r) = r.filter(|r| !r.is_empty() && c.num_samples[k] > 0) else { continue };
        let cfg = BertDatasetConfig {
            sequence_length: c.seq_length,
            seed: c.seed,
            masking_probability: c.mask_prob,
            short_sequence_probability: c.short_seq_prob,
            classification_head: c.binary_head,
            num_samples: Some(c.num_samples[k]),
            pad_id,
        };
        let data = IndexedDataset::open(prefix).with_context(|| format!("opening --data-path {prefix}"))?;
        let ds = BertMaskedDataset::new(data, r, vocab.clone(), cfg)
            .with_context(|| format!("building bert split {k} of {prefix}"))?;
        out[k] = Some(Arc::new(PackedBertDataset(ds)));
    }
    let [train, valid, test] = out;
    Ok(DatasetSplits { train, valid, test })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_layout() {
        let s = BertSample {
            text: vec![2, 7, 3, 9, 3, 0],
            types: vec![0, 0, 0, 1, 1, 0],
            labels: vec![-1, 8, -1, -1, -1, -1],
            is_random: 1,
            padding_mask: vec![1, 1, 1, 1, 1, 0],
            loss_mask: vec![0, 1, 0, 0, 0, 0],
            truncated: 0,
        };
        let p = pack(&s);
        assert_eq!(p.tokens, [2, 7, 3, 9, 3, 0, 0, 0, 0, 1, 1, 0]);
        assert_eq!(p.labels, [0, 8, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]);
        assert_eq!(p.loss_mask, [0., 1., 0., 0., 0., 0., 1., 1., 1., 1., 1., 0.]);
    }
}
