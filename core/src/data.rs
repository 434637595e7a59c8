//! [`Dataset`] and [`Tokenizer`] traits.

use crate::Result;
use std::sync::Arc;

/// One training sample of `seq_length` positions.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub tokens: Vec<i32>,
    pub labels: Vec<i32>,
    pub loss_mask: Vec<f32>,
}

/// Random access to samples; deterministic for a given config and seed.
pub trait Dataset: Send + Sync {
    fn name(&self) -> &str;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn get(&self, index: usize) -> Result<Sample>;
}

/// The train/valid/test datasets a builder produces (a split may be absent).
#[derive(Clone, Default)]
pub struct DatasetSplits {
    pub train: Option<Arc<dyn Dataset>>,
    pub valid: Option<Arc<dyn Dataset>>,
    pub test: Option<Arc<dyn Dataset>>,
}

/// Special token ids a tokenizer may define.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub eod: Option<u32>,
    pub pad: Option<u32>,
    pub cls: Option<u32>,
    pub sep: Option<u32>,
    pub mask: Option<u32>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
}

pub trait Tokenizer: Send + Sync {
    /// Megatron's `--tokenizer-type` name.
    fn name(&self) -> &str;
    /// Size of the unpadded vocabulary.
    fn vocab_size(&self) -> usize;
    fn encode(&self, text: &str) -> Result<Vec<u32>>;
    fn decode(&self, ids: &[u32]) -> Result<String>;
    fn special_ids(&self) -> SpecialIds;
    /// Identifies the vocabulary (written into datasets and checkpoints).
    fn fingerprint(&self) -> String;
}
