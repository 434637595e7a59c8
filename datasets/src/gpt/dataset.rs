//! `GptDataset`: serves GPT training samples from an [`IndexedDataset`] through the indices of
//! [`super::indices`] (SPEC §2.6 `__getitem__`). Sample `k` is the window of `seq_length + 1`
//! tokens `shuffle_index[k]` of the split's (shuffled, epoch-tiled) token stream; tokens are
//! its first `seq_length` ids, labels the last `seq_length`.

use super::cached::{load_or_build_indices, GptCacheKey};
use super::description::GptDescription;
use super::indices::{GptIndices, IndexSpec};
use crate::cache::CacheStatus;
use crate::indexed::IndexedDataset;
use crate::pyjson::PyValue;
use anyhow::{anyhow, Context};
use megatron_core::{Dataset, Result, Sample};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

/// Pad id used when a partial sample is right-padded (Megatron's `-1` when the tokenizer has
/// no usable pad): never a real token, so no real label is masked by accident.
const PAD: i64 = -1;

/// How one split is built.
#[derive(Clone, Debug)]
pub struct GptSplitConfig {
    /// e.g. `"train"`.
    pub split_name: String,
    /// The split's sequence range of the low-level dataset.
    pub sequences: Range<usize>,
    pub seq_length: usize,
    /// `None`: one epoch.
    pub num_samples: Option<usize>,
    pub seed: u32,
    pub drop_last_partial: bool,
}

/// One split of a GPT dataset.
pub struct GptDataset {
    name: String,
    data: Arc<IndexedDataset>,
    seq_length: usize,
    indices: GptIndices,
    description: Option<PyValue>,
    /// The description with the tokenizer's legacy form (a blend's legacy cache name).
    legacy_description: Option<PyValue>,
    cache_status: CacheStatus,
}

impl GptDataset {
    /// Builds the split's indices in memory.
    pub fn new(data: Arc<IndexedDataset>, config: &GptSplitConfig) -> Result<GptDataset> {
        GptDataset::build(data, config, None, None)
    }

    /// Builds the split, reading and writing its indices in `cache_dir` when both it and the
    /// `description` (which names the files) are given.
    pub fn build(
        data: Arc<IndexedDataset>,
        config: &GptSplitConfig,
        description: Option<&GptDescription>,
        cache_dir: Option<&Path>,
    ) -> Result<GptDataset> {
        let name = format!("gpt:{}:{}", config.split_name, data.prefix().display());
        if config.sequences.end > data.len() {
            return Err(anyhow!("{name}: sequences {:?} exceed the dataset's {}", config.sequences, data.len()));
        }
        let indices: Vec<i32> = config
            .sequences
            .clone()
            .map(|i| i32::try_from(i).map_err(|_| anyhow!("{name}: more than 2^31 sequences are not supported")))
            .collect::<Result<_>>()?;
        let spec = IndexSpec {
            sizes: data.sequence_lengths(),
            indices: &indices,
            seq_length: config.seq_length,
            num_samples: config.num_samples,
            seed: config.seed,
            add_extra_token: true,
            drop_last_partial: config.drop_last_partial,
        };
        let text_hash = description.map(|d| d.text_and_hash());
        let legacy = description.and_then(|d| d.legacy());
        let legacy_hash = legacy.as_ref().map(|d| d.text_and_hash());
        let base = |hash: &str| format!("{hash}-GPTDataset-{}", config.split_name);
        let key = match (cache_dir, &text_hash) {
            (Some(dir), Some((text, hash))) => {
                let old = legacy_hash.as_ref().map(|(t, h)| (t.as_str(), base(h)));
                let (description, base) = crate::cache::pick_name(dir, (text.as_str(), base(hash)), old);
                Some(GptCacheKey { dir, base, description })
            }
            _ => None,
        };
        let (indices, cache_status) = load_or_build_indices(&spec, key.as_ref())
            .with_context(|| format!("building the sample indices of {name}"))?;
        Ok(GptDataset {
            name,
            data,
            seq_length: config.seq_length,
            indices,
            description: description.map(|d| d.to_value()),
            legacy_description: legacy.map(|d| d.to_value()),
            cache_status,
        })
    }

    pub fn indices(&self) -> &GptIndices {
        &self.indices
    }

    /// Megatron's `unique_identifiers` (part of a blend's description); `None` when built
    /// without a description.
    pub fn description(&self) -> Option<&PyValue> {
        self.description.as_ref()
    }

    /// [`Self::description`] with the tokenizer's legacy form, when it has one.
    pub fn legacy_description(&self) -> Option<&PyValue> {
        self.legacy_description.as_ref()
    }

    /// Whether the indices came from the cache.
    pub fn cache_status(&self) -> CacheStatus {
        self.cache_status
    }

    pub fn data(&self) -> &Arc<IndexedDataset> {
        &self.data
    }

    pub fn seq_length(&self) -> usize {
        self.seq_length
    }

    /// The `seq_length + 1` token ids of window `j` of the sample index (unshuffled order),
    /// right-padded with `-1` if the window is partial.
    pub fn window(&self, j: usize) -> Result<Vec<i64>> {
        let rows = &self.indices.sample_index;
        let (Some(&[i, o]), Some(&[i2, o2])) = (rows.get(j), rows.get(j + 1)) else {
            return Err(anyhow!(
                "{}: window {j} is out of range ({} windows)",
                self.name,
                rows.len().saturating_sub(1)
            ));
        };
        let doc = |p: i64| self.indices.document_index[p as usize] as usize;
        // Offsets are non-negative except in the degenerate "ran out of documents" row of an
        // empty last document; clamping keeps the read in range.
        let (o, o2) = (o.max(0) as usize, (o2 + 1).max(0) as usize);
        let mut text = Vec::with_capacity(self.seq_length + 1);
        if i == i2 {
            text.extend(self.data.get(doc(i), o, Some(o2.saturating_sub(o)))?);
        } else {
            text.extend(self.data.get(doc(i), o, None)?);
            for p in i + 1..i2 {
                text.extend(self.data.sequence(doc(p))?);
            }
            text.extend(self.data.get(doc(i2), 0, Some(o2))?);
        }
        text.resize(self.seq_length + 1, PAD);
        Ok(text)
    }
}

fn to_i32(v: i64, name: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| anyhow!("{name}: token id {v} does not fit in i32"))
}

impl Dataset for GptDataset {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> usize {
        self.indices.len()
    }

    fn get(&self, index: usize) -> Result<Sample> {
        let &j = self.indices.shuffle_index.get(index).ok_or_else(|| {
            anyhow!("{}: sample {index} is out of range; the split has {} samples", self.name, self.len())
        })?;
        let text = self.window(j as usize)?;
        let s = self.seq_length;
        // Labels equal to the pad are not trained on; pads become id 0 (SPEC §2.6 step 6).
        let loss_mask = text[1..].iter().map(|&l| if l == PAD { 0.0 } else { 1.0 }).collect();
        let clean = |v: &i64| to_i32(if *v == PAD { 0 } else { *v }, &self.name);
        Ok(Sample {
            tokens: text[..s].iter().map(clean).collect::<Result<_>>()?,
            labels: text[1..].iter().map(clean).collect::<Result<_>>()?,
            loss_mask,
        })
    }
}
