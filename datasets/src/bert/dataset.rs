//! [`BertMaskedDataset`]: Megatron's `BERTMaskedWordPieceDataset.__getitem__` (SPEC §2.11)
//! over a sentence-split indexed dataset: the sample's sentences split into segments A/B
//! (sentence-order swap with the binary head), truncation, `[CLS] A [SEP] B [SEP]`, masking
//! and padding, drawing from `RandomState((seed + idx) % 2^32)` in Megatron's order.

use super::masking::{create_masked_lm_predictions, MaskingConfig, MaskingVocab};
use super::rng::NumpyDraws;
use super::sample_index::{build_sample_index, SampleIndexSpec};
use crate::gpt::RandomState;
use crate::IndexedDataset;
use anyhow::{bail, Context, Result};
use std::ops::Range;
use std::path::Path;

/// One sample, Megatron's dict (`text`, `types`, `labels`, `is_random`, `padding_mask`,
/// `loss_mask`, `truncated`); arrays of `sequence_length`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BertSample {
    pub text: Vec<i64>,
    pub types: Vec<i64>,
    /// −1 except at masked positions (original ids there).
    pub labels: Vec<i64>,
    pub is_random: i64,
    /// 1 for real tokens, the pad id where the token equals the pad id.
    pub padding_mask: Vec<i64>,
    pub loss_mask: Vec<i64>,
    pub truncated: i64,
}

impl BertSample {
    /// Positions before the last token that is not padding (the `[SEP]` ending the sample):
    /// the per-row length the model's padding-mask attention takes.
    pub fn length(&self) -> usize {
        self.padding_mask.iter().rposition(|&m| m == 1).map_or(0, |p| p + 1)
    }
}

/// The dataset options of `pretrain_bert.py`.
#[derive(Clone, Debug, PartialEq)]
pub struct BertDatasetConfig {
    pub sequence_length: usize,
    pub seed: u32,
    /// `--mask-prob` (0.15).
    pub masking_probability: f64,
    /// `--short-seq-prob` (0.1).
    pub short_sequence_probability: f64,
    /// Sentence-order head (`not --bert-no-binary-head`).
    pub classification_head: bool,
    /// Samples to build (`None`: one epoch).
    pub num_samples: Option<u64>,
    /// The tokenizer's pad id (`[PAD]` = 0 for BERT vocabularies).
    pub pad_id: i64,
}

pub struct BertMaskedDataset {
    data: IndexedDataset,
    config: BertDatasetConfig,
    vocab: MaskingVocab,
    sample_index: Vec<[u64; 3]>,
}

/// `vocab.txt` (one token per line, id = line number) → the masking vocabulary.
pub fn masking_vocab_from_file(path: &Path) -> Result<MaskingVocab> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading BERT vocabulary {}", path.display()))?;
    let tokens: Vec<&str> = text.lines().collect();
    masking_vocab(&tokens).with_context(|| format!("BERT vocabulary {}", path.display()))
}

/// The masking vocabulary of `tokens` (id order); needs `[CLS]`, `[SEP]` and `[MASK]`.
pub fn masking_vocab(tokens: &[&str]) -> Result<MaskingVocab> {
    let find = |name: &str| -> Result<i64> {
        tokens
            .iter()
            .position(|t| *t == name)
            .map(|p| p as i64)
            .with_context(|| format!("no {name} token in the vocabulary"))
    };
    Ok(MaskingVocab {
        is_subword: tokens.iter().map(|t| t.starts_with("##")).collect(),
        cls: find("[CLS]")?,
        sep: find("[SEP]")?,
        mask: find("[MASK]")?,
    })
}

impl BertMaskedDataset {
    /// Builds the sample index over documents `docs` of `data` (a split's document range).
    pub fn new(
        data: IndexedDataset,
        docs: Range<usize>,
        vocab: MaskingVocab,
        config: BertDatasetConfig,
    ) -> Result<Self> {
        if docs.is_empty() || docs.end > data.num_documents() {
            bail!(
                "bert dataset: document range {docs:?} is not within the {} documents of {}",
                data.num_documents(),
                data.prefix().display()
            );
        }
        if config.sequence_length < 5 || config.sequence_length > i32::MAX as usize {
            bail!("bert dataset: --seq-length {} must be at least 5", config.sequence_length);
        }
        if !(config.masking_probability > 0.0 && config.masking_probability < 1.0) {
            bail!("--mask-prob {} must be in (0, 1)", config.masking_probability);
        }
        let bounds = &data.document_indices()[docs.start..=docs.end];
        let spec = SampleIndexSpec {
            num_samples: config.num_samples,
            max_seq_length: config.sequence_length as i32 - 3,
            short_seq_prob: config.short_sequence_probability,
            seed: config.seed as i32,
            min_sentences: if config.classification_head { 2 } else { 1 },
        };
        let sample_index = build_sample_index(bounds, data.sequence_lengths(), &spec)
            .with_context(|| format!("building the BERT sample index of {}", data.prefix().display()))?;
        Ok(BertMaskedDataset { data, config, vocab, sample_index })
    }

    pub fn len(&self) -> usize {
        self.sample_index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sample_index.is_empty()
    }

    /// The `(first sentence, end sentence, target length)` rows.
    pub fn sample_index(&self) -> &[[u64; 3]] {
        &self.sample_index
    }

    pub fn get(&self, idx: usize) -> Result<BertSample> {
        let [beg, end, target] =
            *self.sample_index.get(idx).with_context(|| format!("bert sample {idx} of {}", self.len()))?;
        let c = &self.config;
        let sentences = (beg..end).map(|i| self.data.sequence(i as usize)).collect::<Result<Vec<_>>>()?;
        let mut rng = RandomState::new(((c.seed as u64 + idx as u64) % (1u64 << 32)) as u32);
        let mut pivot = sentences.len();
        let mut is_random = false;
        if c.classification_head {
            if sentences.len() < 2 {
                bail!("bert sample {idx} has {} sentence(s); the binary head needs two", sentences.len());
            }
            pivot = 1;
            if sentences.len() >= 3 {
                pivot = rng.randint(1, sentences.len() as i64) as usize;
            }
            is_random = rng.random() < 0.5;
        }
        let mut a: Vec<i64> = sentences[..pivot].concat();
        let mut b: Vec<i64> = sentences[pivot..].concat();
        if is_random {
            std::mem::swap(&mut a, &mut b);
        }
        // Trim the longer segment (B on ties) from a random end until A + B fits.
        let truncated = a.len() + b.len() > target as usize;
        while a.len() + b.len() > target as usize {
            let seg = if a.len() > b.len() { &mut a } else { &mut b };
            if rng.random() < 0.5 {
                seg.remove(0);
            } else {
                seg.pop();
            }
        }
        let mut tokens = vec![self.vocab.cls];
        tokens.extend(&a);
        tokens.push(self.vocab.sep);
        let mut types = vec![0i64; a.len() + 2];
        if !b.is_empty() {
            tokens.extend(&b);
            tokens.push(self.vocab.sep);
            types.resize(types.len() + b.len() + 1, 1);
        }
        let cfg = MaskingConfig { probability: c.masking_probability, max_ngram: 3, full_word: true };
        let m = create_masked_lm_predictions(&tokens, target, &cfg, &self.vocab, &mut rng);
        let s = c.sequence_length;
        if m.tokens.len() > s {
            bail!("bert sample {idx}: {} tokens exceed --seq-length {s}", m.tokens.len());
        }
        let pad = c.pad_id;
        let mut text = m.tokens;
        text.resize(s, pad);
        types.resize(s, pad);
        let padding_mask: Vec<i64> = text.iter().map(|&t| if t == pad { pad } else { 1 }).collect();
        let mut labels = vec![-1i64; s];
        let mut loss_mask = vec![0i64; s];
        for (&p, &l) in m.positions.iter().zip(&m.labels) {
            labels[p] = l;
            loss_mask[p] = 1;
        }
        // Padded ids map to 0 so the embedding can look them up.
        text.iter_mut().chain(labels.iter_mut()).filter(|v| **v == pad).for_each(|v| *v = 0);
        Ok(BertSample {
            text,
            types,
            labels,
            is_random: is_random as i64,
            padding_mask,
            loss_mask,
            truncated: truncated as i64,
        })
    }
}
