//! The `t5` dataset plugin: one sentence-split `.bin`/`.idx` prefix (`--data-path`), split by
//! documents with `--split`, and the BERT WordPiece vocabulary file the word-continuation
//! flags come from. The special ids follow Megatron's `BertWordPieceLowerCase` /
//! `BertWordPieceCase` with `--vocab-extra-ids N`: `[CLS] [SEP] [MASK] [PAD]` from the
//! vocabulary file of `V` entries, then `[BOS]` = V, `[EOS]` = V+1, `<extra_id_0..N-1>` =
//! V+2.. (so the model's vocabulary is `V + 2 + N`).

use super::{T5Dataset, T5DatasetConfig, T5Vocab};
use crate::indexed::IndexedDataset;
use crate::split::split_ranges;
use anyhow::{bail, Context, Result};
use megatron_core::{Dataset, DatasetSplits};
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;

pub const NAME: &str = "t5";

fn default_split() -> String {
    "969, 30, 1".to_string()
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct T5PluginConfig {
    /// One prefix (`--data-path PREFIX`); blends are not supported for T5 yet.
    pub data_path: Vec<String>,
    #[serde(default = "default_split")]
    pub split: String,
    /// The BERT `vocab.txt`.
    pub vocab_file: PathBuf,
    pub vocab_extra_ids: usize,
    pub encoder_seq_length: usize,
    pub decoder_seq_length: usize,
    pub seed: i32,
    /// Samples wanted per split (train, valid, test).
    pub num_samples: [u64; 3],
}

/// The [`T5Vocab`] of a BERT vocabulary file with Megatron's added tokens.
pub fn bert_t5_vocab(vocab_file: &PathBuf, extra_ids: usize) -> Result<T5Vocab> {
    let text = std::fs::read_to_string(vocab_file)
        .with_context(|| format!("reading --vocab-file {}", vocab_file.display()))?;
    let words: Vec<&str> = text.lines().collect();
    let find = |w: &str| -> Result<i64> {
        words.iter().position(|&x| x == w).map(|i| i as i64).with_context(|| {
            format!("--vocab-file {} has no {w} token (T5 needs a BERT WordPiece vocabulary)", vocab_file.display())
        })
    };
    if extra_ids == 0 {
        bail!("the t5 dataset needs sentinel tokens: set --vocab-extra-ids (Megatron uses 100)");
    }
    let v = words.len() as i64;
    let mut continuation: Vec<bool> = words.iter().map(|w| w.starts_with("##")).collect();
    continuation.extend(std::iter::repeat_n(false, 2 + extra_ids));
    Ok(T5Vocab {
        continuation,
        cls: find("[CLS]")?,
        sep: find("[SEP]")?,
        mask: find("[MASK]")?,
        pad: find("[PAD]")?,
        bos: v,
        eos: v + 1,
        sentinels: (v + 2..v + 2 + extra_ids as i64).collect(),
    })
}

/// Builds the splits; `tokenizer` (the run's) must agree with the vocabulary built here.
pub fn build_t5_splits(c: &T5PluginConfig, tokenizer: Option<&dyn megatron_core::Tokenizer>) -> Result<DatasetSplits> {
    let [prefix] = c.data_path.as_slice() else {
        bail!(
            "the t5 dataset takes one --data-path prefix (got {:?}); blends are not supported for T5 yet",
            c.data_path
        );
    };
    let data = Arc::new(IndexedDataset::open(prefix).with_context(|| format!("opening --data-path {prefix}"))?);
    let vocab = Arc::new(bert_t5_vocab(&c.vocab_file, c.vocab_extra_ids)?);
    if let Some(t) = tokenizer {
        let sp = t.special_ids();
        let same = t.vocab_size() == vocab.continuation.len()
            && sp.bos.map(i64::from) == Some(vocab.bos)
            && sp.eos.map(i64::from) == Some(vocab.eos)
            && sp.mask.map(i64::from) == Some(vocab.mask);
        if !same {
            bail!(
                "the t5 dataset needs a BERT WordPiece tokenizer over --vocab-file {} with --vocab-extra-ids {} \
                 (tokenizer `{}` has {} ids)",
                c.vocab_file.display(),
                c.vocab_extra_ids,
                t.name(),
                t.vocab_size()
            );
        }
    }
    let n_docs = data.document_indices().len().saturating_sub(1);
    let ranges = split_ranges(&c.split, n_docs)?;
    let mut out: [Option<Arc<dyn Dataset>>; 3] = [None, None, None];
    for (k, r) in ranges.into_iter().enumerate() {
        let Some(r) = r.filter(|r| !r.is_empty() && c.num_samples[k] > 0) else { continue };
        let cfg = T5DatasetConfig::new(c.encoder_seq_length, c.decoder_seq_length, c.seed, c.num_samples[k]);
        let ds =
            T5Dataset::new(data.clone(), r, vocab.clone(), cfg).with_context(|| format!("building t5 split {k}"))?;
        out[k] = Some(Arc::new(ds));
    }
    let [train, valid, test] = out;
    Ok(DatasetSplits { train, valid, test })
}
