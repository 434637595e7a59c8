//! File steps every `megatron import hf` / `export hf` shares, whatever the model: reading a
//! (possibly sharded) safetensors directory, synced writes, the final rename of an export
//! directory, and carrying Hugging Face tokenizer files into a checkpoint and back out.

use anyhow::{bail, Context, Result};
use megatron_checkpoint::CheckpointMeta;
use megatron_core::{DType, HostBuffer, Registry};
use safetensors::{Dtype, SafeTensors};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The safetensors files of `dir`: `model.safetensors`, or the shards
/// `model.safetensors.index.json` names (how transformers saves models above its shard size).
pub(crate) fn shard_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index)
        .with_context(|| format!("{} has neither model.safetensors nor {}", dir.display(), index.display()))?;
    let v: Value = serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", index.display()))?;
    let map = v["weight_map"].as_object().with_context(|| format!("{}: no `weight_map` object", index.display()))?;
    let mut files: Vec<String> = map.values().filter_map(|f| f.as_str().map(String::from)).collect();
    files.sort();
    files.dedup();
    Ok(files.into_iter().map(|f| dir.join(f)).collect())
}

/// A reader of HF tensors by name: `(values as f32, shape)`.
pub(crate) type TensorReader<'a> = dyn FnMut(&str) -> Result<(Vec<f32>, Vec<usize>)> + 'a;

/// Reads every safetensors file of `dir` ([`shard_files`]) and calls `f` with a reader of its
/// tensors by name (F32, F16 or BF16, widened to f32). A tensor stored in two shards is an error.
pub(crate) fn with_safetensors_dir<R>(dir: &Path, f: impl FnOnce(&mut TensorReader) -> Result<R>) -> Result<R> {
    let files = shard_files(dir)?;
    let blobs: Vec<(PathBuf, Vec<u8>)> = files
        .iter()
        .map(|p| Ok((p.clone(), std::fs::read(p).with_context(|| format!("reading {}", p.display()))?)))
        .collect::<Result<_>>()?;
    let parsed: Vec<(&PathBuf, SafeTensors)> = blobs
        .iter()
        .map(|(p, b)| {
            let st = SafeTensors::deserialize(b)
                .map_err(|e| anyhow::anyhow!("{} is not a valid safetensors file: {e}", p.display()))?;
            Ok((p, st))
        })
        .collect::<Result<_>>()?;
    let mut owner: BTreeMap<String, usize> = BTreeMap::new();
    for (i, (path, st)) in parsed.iter().enumerate() {
        for name in st.names() {
            if let Some(j) = owner.insert(name.to_string(), i) {
                bail!("tensor `{name}` is stored in both {} and {}", parsed[j].0.display(), path.display());
            }
        }
    }
    let mut read = |name: &str| -> Result<(Vec<f32>, Vec<usize>)> {
        let i = *owner.get(name).with_context(|| format!("{} has no tensor `{name}`", dir.display()))?;
        let (path, st) = &parsed[i];
        let view = st.tensor(name).with_context(|| format!("{}: tensor `{name}`", path.display()))?;
        let dtype = match view.dtype() {
            Dtype::F32 => DType::F32,
            Dtype::F16 => DType::F16,
            Dtype::BF16 => DType::BF16,
            other => bail!("HF tensor `{name}` in {} has dtype {other:?}; expected F32, F16 or BF16", path.display()),
        };
        let data = HostBuffer::from_le_bytes(dtype, view.data()).with_context(|| format!("HF tensor `{name}`"))?;
        Ok((data.to_f32_vec(), view.shape().to_vec()))
    };
    f(&mut read)
}

/// Writes `bytes` to `path` and syncs it (an export is renamed into place only when whole).
pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(bytes).with_context(|| format!("cannot write {}", path.display()))?;
    f.sync_all().with_context(|| format!("cannot sync {}", path.display()))
}

/// `torch_dtype` of `config.json`.
pub(crate) fn torch_dtype(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        _ => "float32",
    }
}

/// Moves the finished export directory `tmp` to `out` (an existing `out` must be empty).
pub(crate) fn finish_export(tmp: &Path, out: &Path) -> Result<()> {
    if out.exists() {
        std::fs::remove_dir(out).with_context(|| format!("cannot replace empty {}", out.display()))?;
    }
    std::fs::rename(tmp, out).with_context(|| format!("cannot move {} to {}", tmp.display(), out.display()))
}

/// Copies the files `names` that exist in `dir` into the export directory `tmp`.
pub(crate) fn copy_files_out(dir: &Path, names: &[&str], tmp: &Path) -> Result<()> {
    for name in names {
        if dir.join(name).is_file() {
            let bytes =
                std::fs::read(dir.join(name)).with_context(|| format!("reading {}", dir.join(name).display()))?;
            write_synced(&tmp.join(name), &bytes)?;
        }
    }
    Ok(())
}

/// The tokenizer files a Hugging Face directory carries.
pub(crate) const HF_TOKENIZER_FILES: [&str; 3] = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"];

/// Import: copies `dir`'s tokenizer files into `save/tokenizer` and records a
/// `HuggingFaceTokenizer` in `args` (its fingerprint in `meta`); without a `tokenizer.json`,
/// warns and records a `NullTokenizer` of `vocab_size - 1` ids (it adds its own eod).
pub(crate) fn carry_tokenizer_in(
    registry: &Registry,
    dir: &Path,
    save: &Path,
    vocab_size: usize,
    args: &mut Value,
    meta: &mut CheckpointMeta,
) -> Result<()> {
    if !dir.join("tokenizer.json").is_file() {
        println!(
            "WARNING: {} has no tokenizer.json; the checkpoint records a NullTokenizer (prompts are ids)",
            dir.display()
        );
        args["tokenizer_type"] = json!("NullTokenizer");
        args["vocab_size"] = json!(vocab_size - 1);
        return Ok(());
    }
    let tok_dir = save.join("tokenizer");
    std::fs::create_dir_all(&tok_dir).with_context(|| format!("cannot create {}", tok_dir.display()))?;
    for name in HF_TOKENIZER_FILES {
        if dir.join(name).is_file() {
            std::fs::copy(dir.join(name), tok_dir.join(name))
                .with_context(|| format!("copying {} into {}", dir.join(name).display(), tok_dir.display()))?;
        }
    }
    let model_file = std::fs::canonicalize(&tok_dir)?.join("tokenizer.json");
    args["tokenizer_type"] = json!("HuggingFaceTokenizer");
    args["tokenizer_model"] = json!(model_file);
    let t = registry.tokenizer("HuggingFaceTokenizer", json!({ "tokenizer_model": model_file }))?;
    meta.tokenizer_fingerprint = Some(t.fingerprint());
    Ok(())
}
