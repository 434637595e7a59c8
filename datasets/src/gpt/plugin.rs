//! Config and factory of the `gpt` dataset plugin.

use super::dataset::{GptDataset, GptSplitConfig};
use crate::indexed::IndexedDataset;
use crate::split::{split_ranges, DEFAULT_SPLIT, SPLIT_NAMES};
use anyhow::{anyhow, bail};
use megatron_core::registry::DatasetEnv;
use megatron_core::{Dataset, DatasetSplits, Result};
use serde::Deserialize;
use std::sync::Arc;

/// The registered name.
pub const NAME: &str = "gpt";

fn default_split() -> String {
    DEFAULT_SPLIT.to_string()
}

fn default_seed() -> u64 {
    1234
}

/// Config of the `gpt` dataset plugin (Megatron's `--data-path`, `--split`, `--seq-length`,
/// `--seed` and the per-split sample counts of SPEC §2.3).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GptDatasetConfig {
    /// One dataset prefix (entries are split on whitespace, so `"PREFIX"` and `["PREFIX"]` are
    /// the same). Blends (`"0.3 A 0.7 B"`, `"A B"`) are rejected for now.
    pub data_path: Vec<String>,
    #[serde(default = "default_split")]
    pub split: String,
    pub seq_length: usize,
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Requested samples `[train, valid, test]`; 0 builds one epoch (Megatron's `None`).
    pub num_samples: [u64; 3],
    /// The end-of-document id; defaults to the tokenizer's. Kept for `eod_mask_loss` and
    /// `reset_position_ids`, which are not implemented yet.
    #[serde(default)]
    pub eod_token: Option<u32>,
}

/// The single prefix of `data_path`, or an error explaining that blends are not supported.
fn single_prefix(data_path: &[String]) -> Result<String> {
    let words: Vec<&str> = data_path.iter().flat_map(|p| p.split_whitespace()).collect();
    match words[..] {
        [prefix] => Ok(prefix.to_string()),
        [] => bail!("dataset `gpt`: --data-path is empty; give a dataset prefix (PATH without .bin/.idx)"),
        _ => {
            // SPEC §2.1: an even-length list whose even positions all parse as floats is weighted.
            let weighted = words.chunks(2).all(|pair| pair.len() == 2 && pair[0].parse::<f64>().is_ok());
            bail!(
                "dataset `gpt`: blending several datasets ({}--data-path {}) is not yet supported; give a single \
                 prefix (e.g. merge the datasets with `tools/merge_datasets.py`)",
                if weighted { "weighted " } else { "" },
                words.join(" ")
            )
        }
    }
}

/// Builds the train/valid/test datasets; a split of zero width or with no sequences is `None`.
pub fn build_gpt_splits(config: &GptDatasetConfig, env: &DatasetEnv) -> Result<DatasetSplits> {
    let prefix = single_prefix(&config.data_path)?;
    let seed = u32::try_from(config.seed)
        .map_err(|_| anyhow!("dataset `gpt`: --seed {} must fit in 32 bits (numpy's RandomState)", config.seed))?;
    if config.seq_length == 0 {
        bail!("dataset `gpt`: --seq-length must be at least 1");
    }
    if let Some(tok) = &env.tokenizer {
        if let (Some(eod), Some(cfg)) = (tok.special_ids().eod, config.eod_token) {
            if eod != cfg {
                bail!("dataset `gpt`: eod_token {cfg} differs from the tokenizer's eod {eod}; drop one of them");
            }
        }
    }
    let data = Arc::new(IndexedDataset::open(&prefix)?);
    let ranges = split_ranges(&config.split, data.len())?;
    let mut built: Vec<Option<Arc<dyn Dataset>>> = vec![];
    for (k, range) in ranges.into_iter().enumerate() {
        let Some(sequences) = range.filter(|r| !r.is_empty()) else {
            built.push(None);
            continue;
        };
        let split = GptSplitConfig {
            split_name: SPLIT_NAMES[k].to_string(),
            sequences,
            seq_length: config.seq_length,
            num_samples: match config.num_samples[k] {
                0 => None,
                n => Some(usize::try_from(n)?),
            },
            seed,
            drop_last_partial: true,
        };
        built.push(Some(Arc::new(GptDataset::new(data.clone(), &split)?)));
    }
    let mut it = built.into_iter();
    let mut next = || it.next().flatten();
    Ok(DatasetSplits { train: next(), valid: next(), test: next() })
}

#[cfg(test)]
mod tests {
    use super::single_prefix;

    #[test]
    fn data_path_accepts_one_prefix_and_rejects_blends() {
        let one = |v: &[&str]| single_prefix(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(one(&["/d/x_text_document"]).ok().as_deref(), Some("/d/x_text_document"));
        assert_eq!(one(&[" /d/x "]).ok().as_deref(), Some("/d/x"));
        let err = one(&["0.3 A 0.7 B"]).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("weighted") && err.contains("not yet supported"), "{err}");
        let err = one(&["A", "B"]).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("not yet supported") && !err.contains("weighted"), "{err}");
        assert!(one(&[]).is_err());
    }
}
