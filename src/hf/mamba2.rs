//! `megatron import hf` / `export hf` for transformers' `Mamba2ForCausalLM` (the config and
//! tensor name maps are `megatron_hybrid::hf`; this module handles files and checkpoints). A
//! Mamba-2 directory is recognised by `model_type: mamba2` (or its architecture) in
//! `config.json`; it becomes a `mamba` checkpoint (an all-`M` pattern). Hybrid patterns with
//! attention or MLP layers have no transformers `Mamba2ForCausalLM` layout and are refused by
//! the export.
//!
//! The imported checkpoint's args keep the whole `HybridConfig` (`hybrid_config`: expand and
//! conv width have no Megatron flag here) and the original `config.json` (`hf_config`, written
//! back by the export so transformers sees the same model). Export writes `model.safetensors`
//! (vocabulary padding removed, the tied head stored once), `config.json` and the tokenizer
//! files into a temporary directory renamed into place.

use super::export::{export_dtype, safetensors_bytes_as, ExportHfArgs};
use super::files::{carry_tokenizer_in, copy_files_out, finish_export, torch_dtype, write_synced, HF_TOKENIZER_FILES};
use crate::generate::hybrid::load_hybrid;
use anyhow::{bail, Context, Result};
use megatron_checkpoint::CheckpointMeta;
use megatron_core::half::{bf16, f16};
use megatron_core::{Backend, Model, ParallelContext, Registry};
use megatron_hybrid::hf::{config_from_hf_mamba2, export_hf_mamba2, load_hf_mamba2};
use megatron_hybrid::{HybridConfig, HybridModel, LayerKind};
use safetensors::{Dtype, SafeTensors};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Sequence length recorded for an imported model (Mamba-2 has no position limit).
const IMPORT_SEQ_LENGTH: usize = 4096;

/// Whether an HF `config.json` describes a `Mamba2ForCausalLM`.
pub fn is_mamba2(cfg: &Value) -> bool {
    cfg["model_type"].as_str() == Some("mamba2")
        || cfg["architectures"].as_array().is_some_and(|a| a.iter().any(|v| v.as_str() == Some("Mamba2ForCausalLM")))
}

/// f32 values of a safetensors tensor (F32, BF16 or F16).
fn values(st: &SafeTensors, name: &str, file: &Path) -> Result<(Vec<usize>, Vec<f32>)> {
    let t = st.tensor(name).map_err(|e| anyhow::anyhow!("{}: no tensor `{name}` ({e})", file.display()))?;
    let d = t.data();
    let v: Vec<f32> = match t.dtype() {
        Dtype::F32 => d.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        Dtype::BF16 => d.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        Dtype::F16 => d.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        other => bail!("{}: tensor `{name}` has dtype {other:?}; expected F32, BF16 or F16", file.display()),
    };
    Ok((t.shape().to_vec(), v))
}

/// The checkpoint args of an imported model: its whole config, plus the pretrain flags that
/// describe it (for `pretrain --finetune --load`).
fn args_json(c: &HybridConfig, hf: &Value) -> Value {
    json!({
        "model": "mamba",
        "hybrid_config": c,
        "hf_config": hf,
        "num_layers": c.layers().map(|l| l.len()).unwrap_or(0),
        "hybrid_layer_pattern": c.hybrid_layer_pattern,
        "hidden_size": c.hidden_size,
        "num_attention_heads": c.num_attention_heads,
        "seq_length": c.seq_length,
        "make_vocab_size_divisible_by": c.make_vocab_size_divisible_by,
        "mamba_state_dim": c.mamba_state_dim,
        "mamba_head_dim": c.mamba_head_dim,
        "mamba_num_groups": c.mamba_num_groups,
        "mamba_num_heads": c.mamba_num_heads,
        "mamba_chunk_size": c.mamba_chunk_size,
        "normalization": "RMSNorm",
        "norm_epsilon": c.layernorm_epsilon,
        "untie_embeddings_and_output_weights": c.untie_embeddings_and_output_weights,
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "mock_data": false,
        "imported_from": "hf",
    })
}

/// `megatron import hf` of a Mamba-2 directory (called by [`super::import::run`]).
pub fn import(dir: &Path, cfg: &Value, cfg_path: &Path, save: &Path, registry: &Registry) -> Result<PathBuf> {
    let config =
        config_from_hf_mamba2(cfg, IMPORT_SEQ_LENGTH).with_context(|| format!("reading {}", cfg_path.display()))?;
    let st_path = dir.join("model.safetensors");
    let bytes = std::fs::read(&st_path).with_context(|| format!("reading {}", st_path.display()))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| anyhow::anyhow!("{} is not a valid safetensors file: {e}", st_path.display()))?;
    let backend: Arc<dyn Backend> = registry.backend("cpu", json!({}))?;
    let mut model = HybridModel::new(config.clone(), "mamba", backend.clone(), ParallelContext::single())?;
    let mut used = BTreeSet::new();
    load_hf_mamba2(&mut model, &mut |name| {
        used.insert(name.to_string());
        values(&st, name, &st_path)
    })
    .with_context(|| format!("loading {}", st_path.display()))?;
    for name in st.names().into_iter().filter(|n| !used.contains(*n)) {
        // transformers may store the tied head as its own tensor: only an exact copy is dropped.
        let tied_copy = name == "lm_head.weight"
            && !config.untie_embeddings_and_output_weights
            && values(&st, name, &st_path)?.1 == values(&st, "backbone.embeddings.weight", &st_path)?.1;
        if !tied_copy {
            bail!(
                "{}: tensor `{name}` is not part of the Mamba-2 layout megatron-rs imports; refusing to drop it",
                st_path.display()
            );
        }
    }
    let mut args = args_json(&config, cfg);
    let mut meta = CheckpointMeta::default();
    carry_tokenizer_in(registry, dir, save, config.vocab_size, &mut args, &mut meta)?;
    meta.args = args;
    let params = model.params();
    let path = megatron_checkpoint::save(save, 0, &params, None, meta, backend.as_ref(), &ParallelContext::single())
        .with_context(|| format!("saving the imported checkpoint to {}", save.display()))?;
    println!(
        "imported mamba2 {} ({} layers, hidden {}, {} heads x {}, state {}, {} groups, vocab {}) into {}",
        dir.display(),
        config.layers()?.len(),
        config.hidden_size,
        config.mamba_heads(),
        config.mamba_head_dim,
        config.mamba_state_dim,
        config.mamba_num_groups,
        config.vocab_size,
        path.display()
    );
    Ok(path)
}

/// The transformers `config.json` of a Mamba model that was not imported from one.
fn hf_config(c: &HybridConfig, eod: i32) -> Value {
    json!({
        "architectures": ["Mamba2ForCausalLM"],
        "model_type": "mamba2",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.layers().map(|l| l.len()).unwrap_or(0),
        "num_heads": c.mamba_heads(),
        "head_dim": c.mamba_head_dim,
        "state_size": c.mamba_state_dim,
        "n_groups": c.mamba_num_groups,
        "expand": c.mamba_expand,
        "conv_kernel": c.mamba_conv_kernel,
        "chunk_size": c.mamba_chunk_size,
        "use_bias": false,
        "use_conv_bias": true,
        "layer_norm_epsilon": c.layernorm_epsilon,
        "rms_norm": true,
        "norm_before_gate": false,
        "residual_in_fp32": true,
        "tie_word_embeddings": !c.untie_embeddings_and_output_weights,
        "bos_token_id": eod,
        "eos_token_id": eod,
        "pad_token_id": eod,
        "use_cache": true,
    })
}

/// `megatron export hf` of a `mamba`/`hybrid` checkpoint (called by [`super::export::run`]).
pub fn export(args: &ExportHfArgs, registry: &Registry) -> Result<()> {
    let out = &args.out;
    if out.exists() && std::fs::read_dir(out).map(|mut d| d.next().is_some()).unwrap_or(true) {
        bail!("--out {} already exists and is not empty; choose a new directory", out.display());
    }
    let loaded = load_hybrid(registry, &args.load)?;
    let c = loaded.model.config().clone();
    if c.layers()?.iter().any(|k| *k != LayerKind::Mamba) || c.normalization != megatron_transformer::NormKind::RMSNorm
    {
        bail!(
            "only all-Mamba RMSNorm models export to transformers' Mamba2ForCausalLM (this one is `{}`, {:?}); \
             transformers has no layout for hybrid Mamba/attention/MLP patterns of this model",
            c.hybrid_layer_pattern,
            c.normalization
        );
    }
    let (vocab, h) = (c.vocab_size, c.hidden_size);
    let tensors: Vec<(String, Vec<usize>, Vec<f32>)> = export_hf_mamba2(&loaded.model)?
        .into_iter()
        .map(|(name, (mut shape, mut data))| {
            // The padded vocabulary rows are ours only.
            if matches!(name.as_str(), "backbone.embeddings.weight" | "lm_head.weight") {
                shape[0] = vocab;
                data.truncate(vocab * h);
            }
            (name, shape, data)
        })
        .collect();
    let dtype = export_dtype(args.dtype.as_deref(), &loaded.args)?;
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    let name = out.file_name().context("--out needs a directory name")?.to_string_lossy().to_string();
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    write_synced(&tmp.join("model.safetensors"), &safetensors_bytes_as(&tensors, dtype)?)?;
    let mut config = match loaded.args.get("hf_config").filter(|v| v.is_object()) {
        Some(v) => v.clone(),
        None => hf_config(&c, loaded.eod),
    };
    config["torch_dtype"] = json!(torch_dtype(dtype));
    write_synced(&tmp.join("config.json"), serde_json::to_string_pretty(&config)?.as_bytes())?;
    if let Some(model_file) = loaded.args["tokenizer_model"].as_str().map(PathBuf::from) {
        copy_files_out(model_file.parent().unwrap_or(Path::new(".")), &HF_TOKENIZER_FILES, &tmp)?;
    }
    finish_export(&tmp, out)?;
    println!(
        "exported mamba iteration {} of {} to {} ({} tensors, vocab {vocab}, {dtype})",
        loaded.iteration,
        args.load.load.display(),
        out.display(),
        tensors.len()
    );
    Ok(())
}
