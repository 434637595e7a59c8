//! Megatron's `BlendedDataset` (SPEC §2.8): interleaves component datasets by the greedy
//! "largest deficit" rule, as the C++ helpers `build_blending_indices` (fixed size, float
//! weights) and `build_exhaustive_blending_indices` (every component exactly once) do, and
//! serves sample `t` as sample `dataset_sample_index[t]` of component `dataset_index[t]`.

use crate::cache::{CacheEntry, CacheStatus};
use crate::md5::md5_hex;
use crate::npy::{NpyArray, NpyDType};
use crate::pyjson::PyValue;
use anyhow::{anyhow, bail};
use megatron_core::{Dataset, Result, Sample};
use std::path::Path;
use std::sync::Arc;

/// `dataset_index` (which component) and `dataset_sample_index` (which of its samples).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlendIndices {
    pub dataset_index: Vec<i16>,
    pub dataset_sample_index: Vec<i64>,
}

/// `build_blending_indices`: `size` positions; position `t` goes to the component with the
/// largest `w_i * max(t, 1) - count_i` (ties: lowest index). `weights` are normalised.
pub fn blending_indices(weights: &[f64], size: usize) -> BlendIndices {
    let mut counts = vec![0i64; weights.len()];
    let mut out =
        BlendIndices { dataset_index: Vec::with_capacity(size), dataset_sample_index: Vec::with_capacity(size) };
    for t in 0..size {
        let tf = (t as f64).max(1.0);
        let mut best = 0;
        let mut best_err = weights[0] * tf - counts[0] as f64;
        for (i, w) in weights.iter().enumerate().skip(1) {
            let err = w * tf - counts[i] as f64;
            if err > best_err {
                best = i;
                best_err = err;
            }
        }
        out.dataset_index.push(best as i16);
        out.dataset_sample_index.push(counts[best]);
        counts[best] += 1;
    }
    out
}

/// `build_exhaustive_blending_indices`: weights are `len_i / total`; the greedy rule runs over
/// the components not yet exhausted until every component has contributed `len_i` samples.
pub fn exhaustive_blending_indices(lengths: &[u64]) -> BlendIndices {
    let total: u64 = lengths.iter().sum();
    let weights: Vec<f64> = lengths.iter().map(|&l| l as f64 / total as f64).collect();
    let mut counts = vec![0u64; lengths.len()];
    let mut unspent: Vec<usize> = (0..lengths.len()).filter(|&i| lengths[i] > 0).collect();
    let mut out = BlendIndices { dataset_index: vec![], dataset_sample_index: vec![] };
    let mut t = 0u64;
    while !unspent.is_empty() {
        let tf = (t as f64).max(1.0);
        let mut best = unspent[0];
        let mut best_err = f64::MIN;
        // `unspent` stays sorted, as the helper's std::set, so ties go to the lowest index.
        for &i in &unspent {
            let err = weights[i] * tf - counts[i] as f64;
            if err > best_err {
                best = i;
                best_err = err;
            }
        }
        out.dataset_index.push(best as i16);
        out.dataset_sample_index.push(counts[best] as i64);
        counts[best] += 1;
        if counts[best] == lengths[best] {
            unspent.retain(|&i| i != best);
        }
        t += 1;
    }
    out
}

/// How the blend is sized.
#[derive(Clone, Debug)]
pub enum BlendSize {
    /// `size` samples by `weights` (normalised here, as `BlendedDataset.__init__` does).
    Fixed { weights: Vec<f64>, size: usize },
    /// Every sample of every component once; the weights are the lengths.
    Exhaustive { lengths: Vec<u64> },
}

/// A blend of datasets of one split.
pub struct BlendedDataset {
    name: String,
    datasets: Vec<Arc<dyn Dataset>>,
    indices: BlendIndices,
    description: String,
    hash: String,
    cache_status: CacheStatus,
}

const ARRAYS: [&str; 2] = ["dataset_index", "dataset_sample_index"];

impl BlendedDataset {
    /// Builds (or, with `cache_dir`, loads) the blend of `datasets`, whose descriptions are
    /// `component_descriptions`. Megatron caches blends only with `--data-cache-path`.
    pub fn new(
        datasets: Vec<Arc<dyn Dataset>>,
        component_descriptions: Vec<PyValue>,
        split: &str,
        sizing: BlendSize,
        cache_dir: Option<&Path>,
    ) -> Result<BlendedDataset> {
        Self::new_with_legacy(datasets, component_descriptions, None, split, sizing, cache_dir)
    }

    /// As [`Self::new`]; `legacy_descriptions` (the components described with their
    /// tokenizers' legacy form) name the cache files to read when only they exist.
    pub fn new_with_legacy(
        datasets: Vec<Arc<dyn Dataset>>,
        component_descriptions: Vec<PyValue>,
        legacy_descriptions: Option<Vec<PyValue>>,
        split: &str,
        sizing: BlendSize,
        cache_dir: Option<&Path>,
    ) -> Result<BlendedDataset> {
        if datasets.is_empty() || datasets.len() >= 32767 {
            bail!("a blend needs between 1 and 32766 datasets, got {}", datasets.len());
        }
        let (weights_value, size_value, n_weights) = match &sizing {
            BlendSize::Fixed { weights, size } => {
                if let Some(w) = weights.iter().find(|&&w| w.is_nan() || w <= 0.0) {
                    bail!("blend weight {w} must be > 0 (the {split} blend)");
                }
                let w = crate::blend::normalize(weights);
                let value = PyValue::List(w.iter().map(|&x| PyValue::Float(x)).collect());
                (value, PyValue::Int(*size as i64), w.len())
            }
            BlendSize::Exhaustive { lengths } => {
                if lengths.contains(&0) {
                    bail!("the {split} blend has an empty component dataset; drop it from the blend");
                }
                (PyValue::List(lengths.iter().map(|&x| PyValue::Int(x as i64)).collect()), PyValue::Null, lengths.len())
            }
        };
        if n_weights != datasets.len() {
            bail!("the {split} blend has {} datasets but {n_weights} weights", datasets.len());
        }
        let describe = |components: Vec<PyValue>| {
            let text = PyValue::dict([
                ("class", PyValue::str("BlendedDataset")),
                ("datasets", PyValue::List(components)),
                ("split", PyValue::str(split)),
                ("weights", weights_value.clone()),
                ("size", size_value.clone()),
            ])
            .dumps_indent4();
            let hash = md5_hex(text.as_bytes());
            (text, hash)
        };
        let (mut description, mut hash) = describe(component_descriptions);
        if let (Some(dir), Some(legacy)) = (cache_dir, legacy_descriptions) {
            let (old_text, old_hash) = describe(legacy);
            let base = |h: &str| format!("{h}-BlendedDataset-{split}");
            let picked = crate::cache::pick_name(dir, (&description, base(&hash)), Some((&old_text, base(&old_hash))));
            if picked.1 != base(&hash) {
                (description, hash) = (old_text.clone(), old_hash);
            }
        }
        let n_components = datasets.len();
        let entry = CacheEntry {
            dir: cache_dir,
            base: format!("{hash}-BlendedDataset-{split}"),
            description: &description,
            arrays: &ARRAYS,
        };
        let validate = |a: &[NpyArray]| validate_blend(a, n_components);
        let mut build = || -> Result<Vec<NpyArray>> {
            let idx = match &sizing {
                BlendSize::Fixed { weights, size } => blending_indices(&crate::blend::normalize(weights), *size),
                BlendSize::Exhaustive { lengths } => exhaustive_blending_indices(lengths),
            };
            let n = idx.dataset_index.len();
            Ok(vec![
                NpyArray::new(NpyDType::I16, vec![n], idx.dataset_index.iter().map(|&d| i64::from(d)).collect())?,
                NpyArray::new(NpyDType::I64, vec![n], idx.dataset_sample_index)?,
            ])
        };
        let (arrays, cache_status) = entry.load_or_build(&validate, &mut build)?;
        let indices = BlendIndices {
            dataset_index: arrays[0].data.iter().map(|&d| d as i16).collect(),
            dataset_sample_index: arrays[1].data.clone(),
        };
        check_not_oversampled(&indices, &datasets, split)?;
        let name = format!("blend:{split}:{}", datasets.iter().map(|d| d.name()).collect::<Vec<_>>().join("+"));
        Ok(BlendedDataset { name, datasets, indices, description, hash, cache_status })
    }

    pub fn indices(&self) -> &BlendIndices {
        &self.indices
    }

    /// The JSON description whose md5 names the cache files.
    pub fn description(&self) -> &str {
        &self.description
    }

    pub fn hash(&self) -> &str {
        &self.hash
    }

    pub fn cache_status(&self) -> CacheStatus {
        self.cache_status
    }

    pub fn datasets(&self) -> &[Arc<dyn Dataset>] {
        &self.datasets
    }
}

fn validate_blend(a: &[NpyArray], n_components: usize) -> Result<()> {
    let [di, dsi] = a else { bail!("expected two arrays") };
    if di.dtype != NpyDType::I16 || dsi.dtype != NpyDType::I64 || di.shape.len() != 1 || di.shape != dsi.shape {
        bail!("dataset_index must be int16 and dataset_sample_index int64 of the same 1-D shape");
    }
    if di.data.iter().any(|&d| d < 0 || d as usize >= n_components) || dsi.data.iter().any(|&s| s < 0) {
        bail!("an index is out of range");
    }
    Ok(())
}

/// The builder's final check: no component is asked for more samples than it has.
fn check_not_oversampled(idx: &BlendIndices, datasets: &[Arc<dyn Dataset>], split: &str) -> Result<()> {
    let mut need = vec![0usize; datasets.len()];
    for &d in &idx.dataset_index {
        need[d as usize] += 1;
    }
    for (i, (n, ds)) in need.iter().zip(datasets).enumerate() {
        if *n > ds.len() {
            bail!(
                "the {split} blend oversamples its datasets: it requests {n} samples from dataset {i} (`{}`), which \
                 has {}; raise --mid-level-dataset-surplus (default 0.005)",
                ds.name(),
                ds.len()
            );
        }
    }
    Ok(())
}

impl Dataset for BlendedDataset {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> usize {
        self.indices.dataset_index.len()
    }

    fn get(&self, index: usize) -> Result<Sample> {
        let (Some(&d), Some(&s)) =
            (self.indices.dataset_index.get(index), self.indices.dataset_sample_index.get(index))
        else {
            return Err(anyhow!("{}: sample {index} is out of range; the blend has {} samples", self.name, self.len()));
        };
        self.datasets[d as usize].get(s as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_vectors_of_spec_2_8() {
        let got = blending_indices(&[0.5, 0.3, 0.2], 10);
        assert_eq!(got.dataset_index, [0, 1, 2, 0, 1, 0, 2, 0, 1, 0]);
        assert_eq!(got.dataset_sample_index, [0, 0, 0, 1, 1, 2, 1, 3, 2, 4]);
        let got = exhaustive_blending_indices(&[3, 2, 1]);
        assert_eq!(got.dataset_index, [0, 1, 2, 0, 1, 0]);
        assert_eq!(got.dataset_sample_index, [0, 0, 0, 1, 1, 2]);
    }

    /// The greedy rule keeps every component within one sample of its share at every prefix,
    /// and sample indices count up per component: checked on irregular weights.
    #[test]
    fn deficits_stay_bounded_and_counts_are_consecutive() {
        let w = crate::blend::normalize(&[0.17, 0.05, 0.5, 0.28]);
        let got = blending_indices(&w, 2000);
        let mut counts = [0i64; 4];
        for (t, (&d, &s)) in got.dataset_index.iter().zip(&got.dataset_sample_index).enumerate() {
            assert_eq!(s, counts[d as usize], "position {t}");
            counts[d as usize] += 1;
            for (i, wi) in w.iter().enumerate() {
                assert!((wi * (t + 1) as f64 - counts[i] as f64).abs() < 1.0 + 1e-9, "position {t} component {i}");
            }
        }
        let ex = exhaustive_blending_indices(&[7, 1, 13]);
        for (c, want) in [7, 1, 13].into_iter().enumerate() {
            assert_eq!(ex.dataset_index.iter().filter(|&&d| d as usize == c).count(), want);
        }
    }
}
