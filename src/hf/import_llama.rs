//! `megatron import hf` for `LlamaForCausalLM`, `MistralForCausalLM`, `Qwen2ForCausalLM` and
//! `Qwen3ForCausalLM` directories: `config.json` → GPT config (GQA, head size, rope theta and
//! scaling, q/k norms, tied or untied head),
//! `model.safetensors` or sharded `model-0000x-of-0000n.safetensors` with
//! `model.safetensors.index.json` (bf16/fp16/fp32), and `tokenizer.json` +
//! `tokenizer_config.json` copied into the checkpoint. The tensor name map is
//! `megatron_gpt::hf_llama`.

use super::gguf::llama_args_json;
use anyhow::{bail, Context, Result};
use megatron_checkpoint::CheckpointMeta;
use megatron_core::{Backend, Model, ParallelContext, Registry};
use megatron_gpt::{load_hf_llama, GptConfig, GptModel};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Whether an HF `config.json` describes a Llama-family model.
pub fn is_llama_family(cfg: &Value) -> bool {
    matches!(cfg["model_type"].as_str(), Some("llama" | "mistral" | "qwen2" | "qwen3"))
}

fn field(cfg: &Value, key: &str, path: &Path) -> Result<usize> {
    cfg[key].as_u64().map(|v| v as usize).with_context(|| format!("{}: no integer `{key}`", path.display()))
}

/// The GPT config of a Llama/Mistral/Qwen2 `config.json`.
pub fn gpt_config_from_hf_llama(cfg: &Value, path: &Path, divisible_by: usize) -> Result<GptConfig> {
    let ty = cfg["model_type"].as_str().unwrap_or("");
    if let Some(act) = cfg["hidden_act"].as_str().filter(|a| *a != "silu") {
        bail!("{}: hidden_act `{act}` is not the SiLU that SwiGLU uses", path.display());
    }
    let (rope_theta, rope_scaling) = megatron_gpt::hf_rope::rope_from_hf_config(cfg, &path.display().to_string())?;
    if cfg["attention_bias"].as_bool() == Some(true) || cfg["mlp_bias"].as_bool() == Some(true) {
        bail!("{}: attention_bias/mlp_bias are not supported (only Qwen2's qkv bias)", path.display());
    }
    let (heads, hidden) = (field(cfg, "num_attention_heads", path)?, field(cfg, "hidden_size", path)?);
    let ctx = field(cfg, "max_position_embeddings", path)?;
    let mut c =
        GptConfig::new(field(cfg, "num_hidden_layers", path)?, hidden, heads, ctx, field(cfg, "vocab_size", path)?);
    c.ffn_hidden_size = Some(field(cfg, "intermediate_size", path)?);
    c.make_vocab_size_divisible_by = divisible_by;
    c.normalization = megatron_transformer::NormKind::RMSNorm;
    c.layernorm_epsilon = cfg["rms_norm_eps"].as_f64().unwrap_or(1e-6) as f32;
    c.swiglu = true;
    c.add_bias_linear = false;
    c.add_qkv_bias = ty == "qwen2";
    c.position_embedding_type = "rope".into();
    c.rotary_base = rope_theta;
    c.rope_scaling = rope_scaling;
    // Qwen3: RMSNorm of every head's q and k before the rotation (Megatron's --qk-layernorm).
    c.qk_layernorm = ty == "qwen3";
    c.rotary_percent = cfg["partial_rotary_factor"].as_f64().unwrap_or(1.0) as f32;
    let kv = cfg["num_key_value_heads"].as_u64().map_or(heads, |v| v as usize);
    if kv != heads {
        c.num_query_groups = Some(kv);
    }
    if let Some(hd) = cfg["head_dim"].as_u64().map(|v| v as usize).filter(|&hd| hd * heads != hidden) {
        c.kv_channels = Some(hd);
    }
    c.untie_embeddings_and_output_weights = cfg["tie_word_embeddings"].as_bool() == Some(false);
    c.hidden_dropout = 0.0;
    c.attention_dropout = 0.0;
    if let Some(std) = cfg["initializer_range"].as_f64() {
        c.init_method_std = std as f32;
    }
    Ok(c)
}

/// Loads an HF Llama-family directory into a new checkpoint at `save`.
pub fn run(
    dir: &Path,
    cfg: &Value,
    cfg_path: &Path,
    save: &Path,
    divisible_by: usize,
    registry: &Registry,
) -> Result<PathBuf> {
    let config = gpt_config_from_hf_llama(cfg, cfg_path, divisible_by)?;
    let backend: Arc<dyn Backend> = registry.backend("cpu", json!({}))?;
    let mut model = GptModel::new(config.clone(), backend.clone(), ParallelContext::single())?;
    super::files::with_safetensors_dir(dir, |read| load_hf_llama(&mut model, read))
        .with_context(|| format!("loading {}", dir.display()))?;

    let tok_src = dir.join("tokenizer.json");
    let tok_dir = save.join("tokenizer");
    let tokenizer_model = if tok_src.is_file() {
        std::fs::create_dir_all(&tok_dir).with_context(|| format!("cannot create {}", tok_dir.display()))?;
        for name in ["tokenizer.json", "tokenizer_config.json"] {
            if dir.join(name).is_file() {
                std::fs::copy(dir.join(name), tok_dir.join(name))
                    .with_context(|| format!("copying {} into {}", name, tok_dir.display()))?;
            }
        }
        Some(std::fs::canonicalize(&tok_dir)?)
    } else {
        println!("WARNING: {} has no tokenizer.json; the checkpoint records a NullTokenizer", dir.display());
        None
    };
    let mut meta =
        CheckpointMeta { args: llama_args_json(&config, tokenizer_model.as_deref(), "hf"), ..Default::default() };
    if let Some(t) = &tokenizer_model {
        if let Ok(t) = registry.tokenizer("HuggingFaceTokenizer", json!({ "tokenizer_model": t })) {
            meta.tokenizer_fingerprint = Some(t.fingerprint());
        }
    }
    let params = model.params();
    let path = megatron_checkpoint::save(save, 0, &params, None, meta, backend.as_ref(), &ParallelContext::single())
        .with_context(|| format!("saving the imported checkpoint to {}", save.display()))?;
    println!(
        "imported {} ({}, {} layers, hidden {}, {} heads / {} groups) into {}",
        dir.display(),
        cfg["model_type"].as_str().unwrap_or("?"),
        config.num_layers,
        config.hidden_size,
        config.num_attention_heads,
        config.num_query_groups.unwrap_or(config.num_attention_heads),
        path.display()
    );
    Ok(path)
}
