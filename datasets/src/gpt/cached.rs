//! The GPT indices in the index cache (SPEC §2.5): `{hash}-GPTDataset-{split}-` +
//! `document_index.npy` (int32), `sample_index.npy` (`[n+1, 2]`, int32 unless a position or a
//! sequence length needs int64) and `shuffle_index.npy` (uint32, int64 from `2^32 - 2`
//! samples), the dtypes Megatron saves. Loaded arrays are checked against the epoch plan the
//! config implies, so a stale or damaged cache is rebuilt instead of served.

use super::indices::{build_indices, epoch_plan, EpochPlan, GptIndices, IndexSpec};
use crate::cache::{CacheEntry, CacheStatus};
use crate::npy::{NpyArray, NpyDType};
use anyhow::bail;
use megatron_core::Result;
use std::path::Path;

/// Array names, in file-name order.
pub const GPT_ARRAYS: [&str; 3] = ["document_index", "sample_index", "shuffle_index"];

/// The indices as the three arrays Megatron saves.
pub fn to_arrays(idx: &GptIndices, sizes: &[i32]) -> Result<Vec<NpyArray>> {
    let max_size = sizes.iter().copied().max().unwrap_or(0) as usize;
    let sample_dtype =
        if idx.document_index.len().max(max_size) <= i32::MAX as usize { NpyDType::I32 } else { NpyDType::I64 };
    let n = idx.shuffle_index.len();
    let shuffle_dtype = if (n as u64) < u64::from(u32::MAX) - 1 { NpyDType::U32 } else { NpyDType::I64 };
    Ok(vec![
        NpyArray::new(
            NpyDType::I32,
            vec![idx.document_index.len()],
            idx.document_index.iter().map(|&d| i64::from(d)).collect(),
        )?,
        NpyArray::new(
            sample_dtype,
            vec![idx.sample_index.len(), 2],
            idx.sample_index.iter().flatten().copied().collect(),
        )?,
        NpyArray::new(shuffle_dtype, vec![n], idx.shuffle_index.iter().map(|&s| s as i64).collect())?,
    ])
}

/// Checks cached arrays against what `spec` would build: dtypes, shapes and value ranges.
fn validate(arrays: &[NpyArray], spec: &IndexSpec, plan: &EpochPlan) -> Result<()> {
    let [doc, sample, shuffle] = arrays else { bail!("expected three arrays") };
    let n = plan.num_samples;
    let doc_len = spec.indices.len() * plan.num_epochs;
    if doc.dtype != NpyDType::I32 || doc.shape != [doc_len] {
        bail!("document_index should be int32 of shape ({doc_len},), found {} {:?}", doc.dtype.descr(), doc.shape);
    }
    if !matches!(sample.dtype, NpyDType::I32 | NpyDType::I64) || sample.shape != [n + 1, 2] {
        bail!("sample_index should have shape ({}, 2), found {:?}", n + 1, sample.shape);
    }
    if !matches!(shuffle.dtype, NpyDType::U32 | NpyDType::I64) || shuffle.shape != [n] {
        bail!("shuffle_index should have shape ({n},), found {:?}", shuffle.shape);
    }
    let (lo, hi) = spec.indices.iter().fold((i32::MAX, i32::MIN), |(lo, hi), &i| (lo.min(i), hi.max(i)));
    if doc.data.iter().any(|&d| d < i64::from(lo) || d > i64::from(hi)) {
        bail!("document_index holds a sequence outside the split");
    }
    for row in sample.data.chunks_exact(2) {
        let (pos, off) = (row[0], row[1]);
        let ok = pos >= 0
            && (pos as usize) < doc_len
            && off >= -1
            && off <= i64::from(spec.sizes[doc.data[pos as usize] as usize]);
        if !ok {
            bail!("sample_index row ({pos}, {off}) is out of range");
        }
    }
    if shuffle.data.iter().any(|&s| s < 0 || s as usize >= n) {
        bail!("shuffle_index holds a sample outside 0..{n}");
    }
    Ok(())
}

fn from_arrays(arrays: Vec<NpyArray>, plan: &EpochPlan) -> GptIndices {
    let mut it = arrays.into_iter().map(|a| a.data);
    let mut next = || it.next().unwrap_or_default();
    let (doc, sample, shuffle) = (next(), next(), next());
    GptIndices {
        num_epochs: plan.num_epochs,
        separate_final_epoch: plan.separate_final_epoch,
        // `validate` checked the ranges, so the casts are exact.
        document_index: doc.iter().map(|&d| d as i32).collect(),
        sample_index: sample.chunks_exact(2).map(|r| [r[0], r[1]]).collect(),
        shuffle_index: shuffle.iter().map(|&s| s as u64).collect(),
    }
}

/// Where one split's indices are cached.
pub struct GptCacheKey<'a> {
    pub dir: &'a Path,
    /// `{hash}-GPTDataset-{split}`.
    pub base: String,
    pub description: &'a str,
}

/// Loads the indices of `spec` from the cache, or builds (and caches) them.
pub fn load_or_build_indices(spec: &IndexSpec, key: Option<&GptCacheKey>) -> Result<(GptIndices, CacheStatus)> {
    let plan = epoch_plan(spec)?;
    let Some(key) = key else { return Ok((build_indices(spec)?, CacheStatus::Uncached)) };
    let entry =
        CacheEntry { dir: Some(key.dir), base: key.base.clone(), description: key.description, arrays: &GPT_ARRAYS };
    let mut built: Option<GptIndices> = None;
    let (arrays, status) = entry.load_or_build(&|a| validate(a, spec, &plan), &mut || {
        let idx = build_indices(spec)?;
        let arrays = to_arrays(&idx, spec.sizes)?;
        built = Some(idx);
        Ok(arrays)
    })?;
    // A fresh build keeps its own copy rather than converting back.
    let indices = match built {
        Some(idx) => idx,
        None => from_arrays(arrays, &plan),
    };
    Ok((indices, status))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_round_trip_and_validate() -> Result<()> {
        let sizes = [5, 3, 7, 2, 6];
        let spec = IndexSpec {
            sizes: &sizes,
            indices: &[0, 1, 2, 3, 4],
            seq_length: 4,
            num_samples: Some(10),
            seed: 1234,
            add_extra_token: true,
            drop_last_partial: true,
        };
        let plan = epoch_plan(&spec)?;
        let idx = build_indices(&spec)?;
        let arrays = to_arrays(&idx, &sizes)?;
        assert_eq!([arrays[0].dtype, arrays[1].dtype, arrays[2].dtype], [NpyDType::I32, NpyDType::I32, NpyDType::U32]);
        validate(&arrays, &spec, &plan)?;
        assert_eq!(from_arrays(arrays.clone(), &plan), idx);
        // Another seq length implies other shapes: rejected.
        let other = IndexSpec { seq_length: 3, ..spec };
        assert!(validate(&arrays, &other, &epoch_plan(&other)?).is_err());
        let mut bad = arrays;
        bad[2].data[0] = 11;
        assert!(validate(&bad, &spec, &plan).is_err());
        Ok(())
    }
}
