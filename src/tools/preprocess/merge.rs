//! `megatron preprocess --merge`: Megatron's `tools/merge_datasets.py`. The datasets are
//! concatenated in the order given with [`IndexedDatasetBuilder::add_index`] (document
//! indices offset by the sequences before them, `.bin` bytes copied); all must share one
//! dtype. An `--input` that is a directory stands for every prefix in it (a `.idx` with its
//! `.bin`), sorted by name, as `merge_datasets.py --input DIR` does.

use anyhow::{bail, Context, Result};
use megatron_datasets::indexed::{bin_path, idx_path};
use megatron_datasets::{IndexedDataset, IndexedDatasetBuilder};
use std::path::{Path, PathBuf};

/// What a merge wrote.
#[derive(Debug)]
pub struct MergeSummary {
    pub inputs: Vec<PathBuf>,
    pub sequences: usize,
    pub documents: usize,
}

/// The dataset prefixes named by `inputs` (directories expanded, sorted).
pub fn expand_prefixes(inputs: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for input in inputs {
        if input.is_dir() {
            let mut found = Vec::new();
            for entry in std::fs::read_dir(input).with_context(|| format!("cannot list `{}`", input.display()))? {
                let path = entry.with_context(|| format!("cannot list `{}`", input.display()))?.path();
                if let (Some(stem), Some("idx")) = (path.file_stem(), path.extension().and_then(|e| e.to_str())) {
                    let prefix = input.join(stem);
                    if !bin_path(&prefix).is_file() {
                        bail!("`{}` has no matching `.bin`; remove it or regenerate the dataset", path.display());
                    }
                    found.push(prefix);
                }
            }
            if found.is_empty() {
                bail!("the --input directory `{}` contains no .bin/.idx dataset", input.display());
            }
            found.sort();
            out.extend(found);
        } else if idx_path(input).is_file() && bin_path(input).is_file() {
            out.push(input.clone());
        } else {
            bail!(
                "--input `{}` is neither a directory nor a dataset prefix (expected `{}` and `{}`)",
                input.display(),
                bin_path(input).display(),
                idx_path(input).display()
            );
        }
    }
    Ok(out)
}

/// Merges `inputs` (prefixes or directories) into `output_prefix`, atomically.
pub fn merge(inputs: &[PathBuf], output_prefix: &Path) -> Result<MergeSummary> {
    let prefixes = expand_prefixes(inputs)?;
    let Some(first) = prefixes.first() else { bail!("--merge needs at least one --input dataset") };
    if let Some(same) = prefixes.iter().find(|p| p.as_path() == output_prefix) {
        bail!("--output-prefix `{}` is also an --input; choose another output prefix", same.display());
    }
    let dtype = IndexedDataset::open(first)?.dtype();
    let mut builder = IndexedDatasetBuilder::create(output_prefix, dtype)?;
    for prefix in &prefixes {
        builder.add_index(prefix).with_context(|| format!("merging `{}`", prefix.display()))?;
    }
    builder.finalize()?;
    let merged = IndexedDataset::open(output_prefix)?;
    Ok(MergeSummary { inputs: prefixes, sequences: merged.len(), documents: merged.num_documents() })
}
