//! File steps every `megatron import hf` / `export hf` shares, whatever the model: synced
//! writes, the final rename of an export directory, and carrying Hugging Face tokenizer files
//! into a checkpoint and back out.

use anyhow::{Context, Result};
use megatron_checkpoint::CheckpointMeta;
use megatron_core::{DType, Registry};
use serde_json::{json, Value};
use std::path::Path;

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
