//! Megatron's `BlendedMegatronDatasetBuilder` for GPT (SPEC §2.4): one prefix split by
//! `--split`; a blend of prefixes (weighted: components built with the surplus, the blend
//! sized `sum ceil(size * w_i)`; unweighted: components built for one epoch and weighted by
//! length); or separate train/valid/test blends, each over whole prefixes.

use super::dataset::{GptDataset, GptSplitConfig};
use super::description::{GptDescription, TokenizerDescription};
use crate::blend::{normalize, size_per_dataset, Blend, DEFAULT_SURPLUS};
use crate::blended::{BlendSize, BlendedDataset};
use crate::indexed::IndexedDataset;
use crate::split::{parse_split, split_bookends, DEFAULT_SPLIT, SPLIT_NAMES};
use anyhow::{anyhow, bail, Context};
use megatron_core::{Dataset, DatasetSplits, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Where GPT indices are cached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CachePolicy {
    /// Megatron's default: `<prefix>/cache/GPTDataset_indices` (blends are not cached).
    NextToData,
    /// `--data-cache-path DIR` (GPT indices and blends).
    Dir(PathBuf),
    /// Build in memory only.
    InMemory,
}

/// One built split.
#[derive(Clone)]
pub enum BuiltSplit {
    Gpt(Arc<GptDataset>),
    Blend(Arc<BlendedDataset>),
}

impl BuiltSplit {
    pub fn dataset(&self) -> Arc<dyn Dataset> {
        match self {
            BuiltSplit::Gpt(d) => d.clone(),
            BuiltSplit::Blend(d) => d.clone(),
        }
    }
}

/// Everything that decides the GPT datasets of a run.
#[derive(Clone, Debug)]
pub struct GptBuilder {
    /// `--data-path` (with `--split`).
    pub blend: Option<Blend>,
    /// `--train-data-path`, `--valid-data-path`, `--test-data-path`.
    pub blend_per_split: [Option<Blend>; 3],
    /// `None` with `blend`: Megatron's legacy default `"969, 30, 1"`.
    pub split: Option<String>,
    pub seq_length: usize,
    pub seed: u64,
    /// Requested samples per split (`None`: one epoch).
    pub sizes: [Option<u64>; 3],
    pub cache: CachePolicy,
    pub tokenizer: Option<TokenizerDescription>,
    /// `--mid-level-dataset-surplus`.
    pub surplus: f64,
}

/// The bookends a component is built with, and what its description records.
struct SplitPlan<'a> {
    bookends: [Option<(f64, f64)>; 3],
    split: Option<&'a str>,
    split_matrix: Option<[Option<(f64, f64)>; 3]>,
}

impl GptBuilder {
    /// A builder for one blend split by `split`, with Megatron's defaults elsewhere.
    pub fn new(blend: Blend, split: Option<String>, seq_length: usize, seed: u64, sizes: [Option<u64>; 3]) -> Self {
        GptBuilder {
            blend: Some(blend),
            blend_per_split: [None, None, None],
            split,
            seq_length,
            seed,
            sizes,
            cache: CachePolicy::NextToData,
            tokenizer: None,
            surplus: DEFAULT_SURPLUS,
        }
    }

    fn seed32(&self) -> Result<u32> {
        u32::try_from(self.seed)
            .map_err(|_| anyhow!("dataset `gpt`: --seed {} must fit in 32 bits (numpy's RandomState)", self.seed))
    }

    /// Builds train, valid and test (a split may be `None`).
    pub fn build(&self) -> Result<[Option<BuiltSplit>; 3]> {
        if self.seq_length == 0 {
            bail!("dataset `gpt`: --seq-length must be at least 1");
        }
        self.seed32()?;
        let per_split = self.blend_per_split.iter().any(Option::is_some);
        let opened = Mutex::new(HashMap::new());
        match (&self.blend, per_split) {
            (Some(_), true) => bail!(
                "dataset `gpt`: --data-path and --train/valid/test-data-path are mutually exclusive; give one of them"
            ),
            (None, false) => bail!("dataset `gpt`: no data given; pass --data-path PREFIX (or per-split data paths)"),
            (Some(blend), false) => {
                let split = self.split.as_deref().unwrap_or(DEFAULT_SPLIT);
                let bookends = split_bookends(parse_split(split)?);
                let plan = SplitPlan { bookends, split: Some(split), split_matrix: Some(bookends) };
                self.build_blend(&opened, blend, &plan, self.sizes, [0, 1, 2].map(|k| bookends[k].is_some()))
            }
            (None, true) => {
                if self.split.is_some() {
                    bail!("dataset `gpt`: --split cannot be combined with per-split data paths; drop --split");
                }
                let mut out: [Option<BuiltSplit>; 3] = [None, None, None];
                for (k, blend) in self.blend_per_split.iter().enumerate() {
                    let Some(blend) = blend else { continue };
                    let mut bookends = [None; 3];
                    bookends[k] = Some((0.0, 1.0));
                    let plan = SplitPlan { bookends, split: None, split_matrix: None };
                    let mut sizes = [Some(0); 3];
                    sizes[k] = self.sizes[k];
                    let mut only = [false; 3];
                    only[k] = true;
                    // A single prefix is used whole, with or without a weight.
                    let blend = if blend.prefixes.len() == 1 {
                        Blend { weights: None, ..blend.clone() }
                    } else {
                        blend.clone()
                    };
                    out[k] = self.build_blend(&opened, &blend, &plan, sizes, only)?[k].take();
                }
                Ok(out)
            }
        }
    }

    /// Builds splits `wanted` of one blend (`_build_blended_dataset_splits`).
    fn build_blend(
        &self,
        opened: &Mutex<HashMap<String, Arc<IndexedDataset>>>,
        blend: &Blend,
        plan: &SplitPlan,
        sizes: [Option<u64>; 3],
        wanted: [bool; 3],
    ) -> Result<[Option<BuiltSplit>; 3]> {
        if blend.prefixes.len() == 1 && blend.weights.is_none() {
            let comps = self.build_component(opened, &blend.prefixes[0], plan, sizes)?;
            return Ok(comps.map(|c| c.map(BuiltSplit::Gpt)));
        }
        let weights = blend.weights.as_deref().map(normalize);
        let need_size = |k: usize| {
            sizes[k].ok_or_else(|| {
                anyhow!(
                    "dataset `gpt`: a weighted blend needs a sample count for the {} split (e.g. --eval-iters > 0)",
                    SPLIT_NAMES[k]
                )
            })
        };
        let mut components = vec![];
        for (p, prefix) in blend.prefixes.iter().enumerate() {
            let mut buffer = [None; 3];
            if let Some(w) = &weights {
                for k in (0..3).filter(|&k| wanted[k]) {
                    buffer[k] = Some(size_per_dataset(w, need_size(k)?, self.surplus)[p]);
                }
            }
            components.push(self.build_component(opened, prefix, plan, buffer)?);
        }
        let blend_dir = match &self.cache {
            CachePolicy::Dir(d) => Some(d.as_path()),
            _ => None,
        };
        let mut out: [Option<BuiltSplit>; 3] = [None, None, None];
        for k in (0..3).filter(|&k| wanted[k]) {
            // A split no component has (e.g. a tiny test split rounded to zero) is not built.
            if components.iter().all(|c| c[k].is_none()) {
                continue;
            }
            let mut parts = vec![];
            for (p, comp) in components.iter().enumerate() {
                let d = comp[k].clone().ok_or_else(|| {
                    anyhow!("dataset `gpt`: `{}` has no sequences in the {} split", blend.prefixes[p], SPLIT_NAMES[k])
                })?;
                parts.push(d);
            }
            let sizing = match &weights {
                Some(w) => BlendSize::Fixed {
                    weights: w.clone(),
                    size: size_per_dataset(w, need_size(k)?, 0.0).iter().sum::<u64>() as usize,
                },
                None => {
                    let lengths: Vec<u64> = parts.iter().map(|d| d.len() as u64).collect();
                    match sizes[k] {
                        Some(size) => BlendSize::Fixed {
                            weights: lengths.iter().map(|&l| l as f64).collect(),
                            size: size.min(lengths.iter().sum()) as usize,
                        },
                        None => BlendSize::Exhaustive { lengths },
                    }
                }
            };
            let descriptions = parts.iter().filter_map(|d| d.description().cloned()).collect();
            // Components without a legacy form keep their current description in the legacy name.
            let legacy = parts
                .iter()
                .any(|d| d.legacy_description().is_some())
                .then(|| parts.iter().filter_map(|d| d.legacy_description().or(d.description()).cloned()).collect());
            let datasets = parts.iter().map(|d| d.clone() as Arc<dyn Dataset>).collect();
            let blended =
                BlendedDataset::new_with_legacy(datasets, descriptions, legacy, SPLIT_NAMES[k], sizing, blend_dir)
                    .with_context(|| format!("building the {} blend", SPLIT_NAMES[k]))?;
            out[k] = Some(BuiltSplit::Blend(Arc::new(blended)));
        }
        Ok(out)
    }

    /// `_build_megatron_dataset_splits`: the GPT datasets of one prefix; a split without
    /// bookends or without sequences is `None`.
    fn build_component(
        &self,
        opened: &Mutex<HashMap<String, Arc<IndexedDataset>>>,
        prefix: &str,
        plan: &SplitPlan,
        sizes: [Option<u64>; 3],
    ) -> Result<[Option<Arc<GptDataset>>; 3]> {
        let data = {
            let mut map = opened.lock().map_err(|_| anyhow!("a dataset build thread panicked"))?;
            match map.get(prefix) {
                Some(d) => Arc::clone(d),
                None => {
                    let d = Arc::new(IndexedDataset::open(prefix)?);
                    map.insert(prefix.to_string(), d.clone());
                    d
                }
            }
        };
        let cache_dir = match &self.cache {
            CachePolicy::NextToData => Some(Path::new(prefix).join("cache").join("GPTDataset_indices")),
            CachePolicy::Dir(d) => Some(d.clone()),
            CachePolicy::InMemory => None,
        };
        let n = data.len() as f64;
        let mut out: [Option<Arc<GptDataset>>; 3] = [None, None, None];
        for k in 0..3 {
            let Some((lo, hi)) = plan.bookends[k] else { continue };
            let (begin, end) = ((lo * n).round_ties_even() as usize, (hi * n).round_ties_even() as usize);
            if end <= begin {
                continue;
            }
            let config = GptSplitConfig {
                split_name: SPLIT_NAMES[k].to_string(),
                sequences: begin..end,
                seq_length: self.seq_length,
                num_samples: sizes[k].map(|s| s as usize),
                seed: self.seed32()?,
                drop_last_partial: true,
            };
            let description = GptDescription {
                dataset_path: prefix,
                num_samples: sizes[k],
                index_split: SPLIT_NAMES[k],
                random_seed: self.seed,
                sequence_length: self.seq_length,
                split: plan.split,
                split_matrix: plan.split_matrix,
                tokenizer: self.tokenizer.as_ref(),
            };
            out[k] =
                Some(Arc::new(GptDataset::build(data.clone(), &config, Some(&description), cache_dir.as_deref())?));
        }
        Ok(out)
    }
}

/// The splits as the registry's [`DatasetSplits`].
pub fn to_dataset_splits(built: [Option<BuiltSplit>; 3]) -> DatasetSplits {
    let [train, valid, test] = built.map(|b| b.map(|b| b.dataset()));
    DatasetSplits { train, valid, test }
}
