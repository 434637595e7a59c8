//! Config and factory of the `gpt` dataset plugin.

use super::builder::{to_dataset_splits, CachePolicy, GptBuilder};
use super::description::TokenizerDescription;
use crate::blend::{Blend, DEFAULT_SURPLUS};
use anyhow::bail;
use megatron_core::registry::DatasetEnv;
use megatron_core::{DatasetSplits, Result};
use serde::Deserialize;
use std::path::PathBuf;

/// The registered name.
pub const NAME: &str = "gpt";

fn default_seed() -> u64 {
    1234
}

fn default_surplus() -> f64 {
    DEFAULT_SURPLUS
}

/// Config of the `gpt` dataset plugin (Megatron's `--data-path`, `--split`, per-split data
/// paths, `--seq-length`, `--seed`, `--data-cache-path` and the per-split sample counts of
/// SPEC §2.3). Path lists are split on whitespace, so `"0.3 A 0.7 B"` and
/// `["0.3", "A", "0.7", "B"]` are the same blend.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GptDatasetConfig {
    /// `PREFIX`, `W1 P1 W2 P2 ...` (weighted) or `P1 P2 ...` (weighted by length).
    #[serde(default)]
    pub data_path: Vec<String>,
    #[serde(default)]
    pub train_data_path: Vec<String>,
    #[serde(default)]
    pub valid_data_path: Vec<String>,
    #[serde(default)]
    pub test_data_path: Vec<String>,
    /// Default with `data_path`: Megatron's legacy `"969, 30, 1"`.
    #[serde(default)]
    pub split: Option<String>,
    pub seq_length: usize,
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Requested samples `[train, valid, test]`; 0 builds one epoch (Megatron's `None`).
    pub num_samples: [u64; 3],
    /// The end-of-document id; defaults to the tokenizer's. Kept for `eod_mask_loss` and
    /// `reset_position_ids`, which are not implemented yet.
    #[serde(default)]
    pub eod_token: Option<u32>,
    /// `--data-cache-path`; without it the indices are cached in `<prefix>/cache/GPTDataset_indices`.
    #[serde(default)]
    pub data_cache_path: Option<PathBuf>,
    /// `--mid-level-dataset-surplus`.
    #[serde(default = "default_surplus")]
    pub mid_level_dataset_surplus: f64,
    /// The tokenizer's description as Megatron records it (part of the cache hash).
    #[serde(default)]
    pub tokenizer: Option<TokenizerDescription>,
}

impl GptDatasetConfig {
    /// The builder these settings describe.
    pub fn builder(&self) -> Result<GptBuilder> {
        let blend = Blend::parse(&self.data_path)?;
        let blend_per_split =
            [&self.train_data_path, &self.valid_data_path, &self.test_data_path].map(|p| Blend::parse(p));
        let [train, valid, test] = blend_per_split;
        if !(self.mid_level_dataset_surplus >= 0.0 && self.mid_level_dataset_surplus.is_finite()) {
            bail!("dataset `gpt`: --mid-level-dataset-surplus must be >= 0");
        }
        Ok(GptBuilder {
            blend,
            blend_per_split: [train?, valid?, test?],
            split: self.split.clone(),
            seq_length: self.seq_length,
            seed: self.seed,
            sizes: self.num_samples.map(|n| (n > 0).then_some(n)),
            cache: match &self.data_cache_path {
                Some(dir) => CachePolicy::Dir(dir.clone()),
                None => CachePolicy::NextToData,
            },
            tokenizer: self.tokenizer.clone(),
            surplus: self.mid_level_dataset_surplus,
        })
    }
}

/// Builds the train/valid/test datasets; a split of zero width or with no sequences is `None`.
pub fn build_gpt_splits(config: &GptDatasetConfig, env: &DatasetEnv) -> Result<DatasetSplits> {
    if let Some(tok) = &env.tokenizer {
        if let (Some(eod), Some(cfg)) = (tok.special_ids().eod, config.eod_token) {
            if eod != cfg {
                bail!("dataset `gpt`: eod_token {cfg} differs from the tokenizer's eod {eod}; drop one of them");
            }
        }
    }
    Ok(to_dataset_splits(config.builder()?.build()?))
}
