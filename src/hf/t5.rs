//! `megatron import hf` / `export hf` for Hugging Face `T5ForConditionalGeneration` (the
//! config and tensor name maps are `megatron_t5::hf`; this module handles files and
//! checkpoints). A T5 directory is recognised by `model_type: t5` (or its architecture) in
//! `config.json`; a T5 checkpoint by `model: t5` in its args.
//!
//! The imported checkpoint's args keep the whole `T5Config` (`t5_config`: options such as the
//! gated GeLU and the head scaling have no Megatron flag), the original `config.json`
//! (`hf_config`, written back by the export so transformers sees the same model) and the
//! generation ids. Export writes `model.safetensors` (tied `shared.weight` once, as
//! transformers saves it), `config.json`, `generation_config.json` and the tokenizer files
//! into a temporary directory renamed into place.

use super::export::{export_dtype, safetensors_bytes_as, ExportHfArgs};
use super::files::{carry_tokenizer_in, copy_files_out, finish_export, torch_dtype, write_synced, HF_TOKENIZER_FILES};
use crate::generate::t5::load_t5;
use anyhow::{bail, Context, Result};
use megatron_checkpoint::CheckpointMeta;
use megatron_core::half::{bf16, f16};
use megatron_core::{Backend, Model, ParallelContext, Registry};
use megatron_t5::hf::{export_hf_t5, load_hf_t5, t5_config_from_hf};
use megatron_t5::{T5Activation, T5Config, T5Model};
use safetensors::{Dtype, SafeTensors};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Whether an HF `config.json` describes a T5 encoder-decoder.
pub fn is_t5(cfg: &Value) -> bool {
    cfg["model_type"].as_str() == Some("t5")
        || cfg["architectures"]
            .as_array()
            .is_some_and(|a| a.iter().any(|v| v.as_str() == Some("T5ForConditionalGeneration")))
}

/// Names transformers may store for the tied word embedding besides `shared.weight` (with an
/// untied head `lm_head.weight` is read as the head and so never taken for a copy).
const TIED: [&str; 3] = ["encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"];

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

/// `megatron import hf` of a T5 directory (called by [`super::import::run`]).
pub fn import(dir: &Path, cfg: &Value, cfg_path: &Path, save: &Path, registry: &Registry) -> Result<PathBuf> {
    // Sequence lengths are not part of a relative-position model; these are recorded defaults.
    let enc_seq = cfg["n_positions"].as_u64().unwrap_or(512) as usize;
    let config = t5_config_from_hf(cfg, enc_seq, 128).with_context(|| format!("reading {}", cfg_path.display()))?;
    let st_path = dir.join("model.safetensors");
    let bytes = std::fs::read(&st_path).with_context(|| format!("reading {}", st_path.display()))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| anyhow::anyhow!("{} is not a valid safetensors file: {e}", st_path.display()))?;
    let names: BTreeSet<String> = st.names().into_iter().cloned().collect();
    let used = RefCell::new(BTreeSet::new());
    let get = |name: &str| -> Result<(Vec<usize>, Vec<f32>)> {
        // The tied embedding may be stored under any of its names.
        let stored = if name == "shared.weight" && !names.contains(name) {
            TIED.iter().find(|n| names.contains(**n)).copied().unwrap_or(name)
        } else {
            name
        };
        used.borrow_mut().insert(stored.to_string());
        values(&st, stored, &st_path)
    };
    let backend: Arc<dyn Backend> = registry.backend("cpu", json!({}))?;
    let mut model = T5Model::new(config.clone(), backend.clone(), ParallelContext::single())?;
    load_hf_t5(&mut model, &get).with_context(|| format!("loading {}", st_path.display()))?;
    let shared = get("shared.weight")?.1;
    for name in names.iter().filter(|n| !used.borrow().contains(*n)) {
        if TIED.contains(&name.as_str()) && values(&st, name, &st_path)?.1 == shared {
            continue; // a stored copy of the tied embedding
        }
        bail!(
            "{}: tensor `{name}` is not part of the T5 layout megatron-rs imports (tied head, no biases); \
             refusing to drop it silently",
            st_path.display()
        );
    }

    let mut args = json!({
        "model": "t5",
        "t5_config": config,
        "hf_config": cfg,
        "num_layers": config.encoder_num_layers,
        "encoder_num_layers": config.encoder_num_layers,
        "decoder_num_layers": config.decoder_num_layers,
        "hidden_size": config.hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "kv_channels": config.kv_channels,
        "ffn_hidden_size": config.ffn_hidden_size,
        "position_embedding_type": "relative",
        "normalization": "RMSNorm",
        "decoder_start_token_id": cfg["decoder_start_token_id"].as_i64().unwrap_or(0),
        "eos_token_id": cfg["eos_token_id"].as_i64().unwrap_or(1),
        "pad_token_id": cfg["pad_token_id"].as_i64().unwrap_or(0),
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "mock_data": false,
        "imported_from": "hf",
    });
    let mut meta = CheckpointMeta::default();
    carry_tokenizer_in(registry, dir, save, config.vocab_size, &mut args, &mut meta)?;
    meta.args = args;
    let params = model.params();
    let path = megatron_checkpoint::save(save, 0, &params, None, meta, backend.as_ref(), &ParallelContext::single())
        .with_context(|| format!("saving the imported checkpoint to {}", save.display()))?;
    println!(
        "imported t5 {} ({}+{} layers, hidden {}, {} heads, vocab {}, {:?}) into {}",
        dir.display(),
        config.encoder_num_layers,
        config.decoder_num_layers,
        config.hidden_size,
        config.num_attention_heads,
        config.vocab_size,
        config.activation,
        path.display()
    );
    Ok(path)
}

/// The HF `config.json` of a T5 model that was not imported from one (trained here with
/// relative positions, RMSNorm, no biases).
fn hf_config(c: &T5Config, start: i32, eos: Option<i32>) -> Value {
    json!({
        "architectures": ["T5ForConditionalGeneration"],
        "model_type": "t5",
        "is_encoder_decoder": true,
        "vocab_size": c.vocab_size,
        "d_model": c.hidden_size,
        "d_kv": c.head_dim(),
        "d_ff": c.ffn_hidden_size(),
        "num_layers": c.encoder_num_layers,
        "num_decoder_layers": c.decoder_num_layers,
        "num_heads": c.num_attention_heads,
        "relative_attention_num_buckets": c.relative_attention_num_buckets,
        "relative_attention_max_distance": c.relative_attention_max_distance,
        "layer_norm_epsilon": c.layernorm_epsilon,
        "feed_forward_proj": if c.activation == T5Activation::GatedGelu { "gated-gelu" } else { "relu" },
        "dropout_rate": 0.0,
        "tie_word_embeddings": !c.untie_embeddings_and_output_weights,
        "scale_decoder_outputs": c.output_scale.is_some(),
        "decoder_start_token_id": start,
        "pad_token_id": start,
        "eos_token_id": eos,
        "use_cache": true,
    })
}

/// `megatron export hf` of a T5 checkpoint (called by [`super::export::run`]).
pub fn export(args: &ExportHfArgs, registry: &Registry) -> Result<()> {
    let out = &args.out;
    if out.exists() && std::fs::read_dir(out).map(|mut d| d.next().is_some()).unwrap_or(true) {
        bail!("--out {} already exists and is not empty; choose a new directory", out.display());
    }
    let loaded = load_t5(registry, &args.load, 1, 1)?;
    let c = loaded.model.config().clone();
    if c.activation == T5Activation::Gelu || c.normalization != megatron_transformer::NormKind::RMSNorm {
        bail!(
            "only Hugging Face shaped T5 models export (relative positions, RMSNorm, relu or gated-gelu, no biases); \
             this one has {:?} and {:?}",
            c.normalization,
            c.activation
        );
    }
    let d_scale = (c.hidden_size as f32).powf(-0.5);
    if c.output_scale.is_some_and(|s| s != d_scale) {
        bail!(
            "Hugging Face T5 scales the decoder output by d_model^-0.5 = {d_scale} or not at all; this model has \
             output_scale {:?}",
            c.output_scale
        );
    }
    let tensors = export_hf_t5(&loaded.model)?;
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
        None => hf_config(&c, loaded.decoder_start, loaded.eos),
    };
    config["torch_dtype"] = json!(torch_dtype(dtype));
    write_synced(&tmp.join("config.json"), serde_json::to_string_pretty(&config)?.as_bytes())?;
    let gen = json!({
        "decoder_start_token_id": loaded.decoder_start,
        "eos_token_id": loaded.eos,
        "pad_token_id": loaded.args["pad_token_id"].as_i64().unwrap_or(loaded.decoder_start as i64),
        "_from_model_config": true,
    });
    write_synced(&tmp.join("generation_config.json"), serde_json::to_string_pretty(&gen)?.as_bytes())?;
    if let Some(model_file) = loaded.args["tokenizer_model"].as_str().map(PathBuf::from) {
        copy_files_out(model_file.parent().unwrap_or(Path::new(".")), &HF_TOKENIZER_FILES, &tmp)?;
    }
    finish_export(&tmp, out)?;
    println!(
        "exported t5 iteration {} of {} to {} ({} tensors, vocab {}, {dtype})",
        loaded.iteration,
        args.load.load.display(),
        out.display(),
        tensors.len(),
        c.vocab_size
    );
    Ok(())
}
