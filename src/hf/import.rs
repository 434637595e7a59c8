//! `megatron import hf`: a Hugging Face GPT-2 directory becomes a megatron-rs checkpoint at
//! iteration 0 whose args record the model shape and tokenizer, so `generate`, `serve`,
//! `export hf` and `pretrain --finetune --load` can use it. Every tensor is kept (biases,
//! LayerNorm parameters, the tied head); the vocabulary is padded to Megatron's size.

use anyhow::{bail, Context, Result};
use clap::Args;
use megatron_checkpoint::CheckpointMeta;
use megatron_core::{Backend, Model, ParallelContext, Registry};
use megatron_gpt::{load_hf_gpt2, GptConfig, GptModel};
use safetensors::SafeTensors;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Args, Clone, Debug)]
pub struct ImportHfArgs {
    /// HF directory with config.json and model.safetensors (vocab.json + merges.txt optional).
    #[arg(long)]
    pub hf_dir: PathBuf,
    /// Checkpoint directory to create (`iter_0000000` inside).
    #[arg(long)]
    pub save: PathBuf,
    /// Megatron's vocabulary padding multiple.
    #[arg(long, default_value_t = 128)]
    pub make_vocab_size_divisible_by: usize,
}

fn field(cfg: &Value, key: &str, path: &Path) -> Result<usize> {
    cfg[key].as_u64().map(|v| v as usize).with_context(|| format!("{}: no integer `{key}`", path.display()))
}

/// The GPT config of an HF GPT-2 `config.json`, and whether its head is untied.
pub fn gpt_config_from_hf(cfg: &Value, path: &Path, divisible_by: usize) -> Result<GptConfig> {
    if divisible_by == 0 {
        bail!("--make-vocab-size-divisible-by must be >= 1 (Megatron's default is 128)");
    }
    if let Some(t) = cfg["model_type"].as_str() {
        if t != "gpt2" {
            bail!("{}: model_type `{t}` is not gpt2, llama, mistral or qwen2", path.display());
        }
    }
    let act = cfg["activation_function"].as_str().unwrap_or("gelu_new");
    if !matches!(act, "gelu_new" | "gelu_fast" | "gelu_pytorch_tanh") {
        bail!(
            "{}: activation_function `{act}` is not the tanh GeLU megatron-rs computes \
             (gelu_new, gelu_fast, gelu_pytorch_tanh)",
            path.display()
        );
    }
    let n_pos = field(cfg, "n_positions", path)?;
    let mut c = GptConfig::new(
        field(cfg, "n_layer", path)?,
        field(cfg, "n_embd", path)?,
        field(cfg, "n_head", path)?,
        n_pos,
        field(cfg, "vocab_size", path)?,
    );
    c.ffn_hidden_size = cfg["n_inner"].as_u64().map(|v| v as usize);
    c.layernorm_epsilon = cfg["layer_norm_epsilon"].as_f64().unwrap_or(1e-5) as f32;
    c.make_vocab_size_divisible_by = divisible_by;
    c.untie_embeddings_and_output_weights = cfg["tie_word_embeddings"].as_bool() == Some(false);
    c.hidden_dropout = 0.0;
    c.attention_dropout = 0.0;
    if let Some(std) = cfg["initializer_range"].as_f64() {
        c.init_method_std = std as f32;
    }
    Ok(c)
}

/// The training args a checkpoint of `c` records (the `megatron pretrain` flag names).
fn args_json(c: &GptConfig, vocab_file: Option<&Path>, merge_file: Option<&Path>) -> Value {
    json!({
        "model": "gpt",
        "num_layers": c.num_layers,
        "hidden_size": c.hidden_size,
        "ffn_hidden_size": c.ffn_hidden_size,
        "num_attention_heads": c.num_attention_heads,
        "seq_length": c.seq_length,
        "max_position_embeddings": c.max_position_embeddings,
        "make_vocab_size_divisible_by": c.make_vocab_size_divisible_by,
        "normalization": "LayerNorm",
        "norm_epsilon": c.layernorm_epsilon,
        "position_embedding_type": "learned_absolute",
        "swiglu": false,
        "untie_embeddings_and_output_weights": c.untie_embeddings_and_output_weights,
        "init_method_std": c.init_method_std,
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "tokenizer_type": if vocab_file.is_some() { json!("GPT2BPETokenizer") } else { json!("NullTokenizer") },
        "vocab_file": vocab_file,
        "merge_file": merge_file,
        "vocab_size": if vocab_file.is_some() { Value::Null } else { json!(c.vocab_size - 1) },
        "mock_data": false,
        "imported_from": "hf",
    })
}

pub fn run(args: &ImportHfArgs, registry: &Registry) -> Result<PathBuf> {
    let dir = &args.hf_dir;
    let cfg_path = dir.join("config.json");
    let text =
        std::fs::read_to_string(&cfg_path).with_context(|| format!("reading {} (--hf-dir)", cfg_path.display()))?;
    let cfg: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", cfg_path.display()))?;
    if super::import_mixtral::is_mixtral(&cfg) {
        return super::import_mixtral::run(
            dir,
            &cfg,
            &cfg_path,
            &args.save,
            args.make_vocab_size_divisible_by,
            registry,
        );
    }
    #[cfg(feature = "bert")]
    if super::bert::is_bert(&cfg) {
        return super::bert::import(dir, &cfg, &args.save, args.make_vocab_size_divisible_by, registry);
    }
    #[cfg(feature = "t5")]
    if super::t5::is_t5(&cfg) {
        return super::t5::import(dir, &cfg, &cfg_path, &args.save, registry);
    }
    #[cfg(feature = "hybrid")]
    if super::mamba2::is_mamba2(&cfg) {
        return super::mamba2::import(dir, &cfg, &cfg_path, &args.save, registry);
    }
    if super::import_llama::is_llama_family(&cfg) {
        return super::import_llama::run(dir, &cfg, &cfg_path, &args.save, args.make_vocab_size_divisible_by, registry);
    }
    let config = gpt_config_from_hf(&cfg, &cfg_path, args.make_vocab_size_divisible_by)?;

    // Tokenizer files travel with the checkpoint (copied), so it does not depend on --hf-dir.
    let (vocab, merges) = (dir.join("vocab.json"), dir.join("merges.txt"));
    let tok_dir = args.save.join("tokenizer");
    let (vocab_file, merge_file) = if vocab.exists() && merges.exists() {
        std::fs::create_dir_all(&tok_dir).with_context(|| format!("cannot create {}", tok_dir.display()))?;
        for (src, name) in [(&vocab, "vocab.json"), (&merges, "merges.txt")] {
            std::fs::copy(src, tok_dir.join(name))
                .with_context(|| format!("copying {} into {}", src.display(), tok_dir.display()))?;
        }
        let abs = std::fs::canonicalize(&tok_dir)?;
        (Some(abs.join("vocab.json")), Some(abs.join("merges.txt")))
    } else {
        println!("WARNING: {} has no vocab.json + merges.txt; the checkpoint records a NullTokenizer", dir.display());
        (None, None)
    };

    let backend: Arc<dyn Backend> = registry.backend("cpu", json!({}))?;
    let mut model = GptModel::new(config.clone(), backend.clone(), ParallelContext::single())?;
    let st_path = dir.join("model.safetensors");
    let bytes = std::fs::read(&st_path).with_context(|| format!("reading {}", st_path.display()))?;
    let tensors = SafeTensors::deserialize(&bytes)
        .map_err(|e| anyhow::anyhow!("{} is not a valid safetensors file: {e}", st_path.display()))?;
    load_hf_gpt2(&mut model, &tensors).with_context(|| format!("loading {}", st_path.display()))?;

    let mut meta =
        CheckpointMeta { args: args_json(&config, vocab_file.as_deref(), merge_file.as_deref()), ..Default::default() };
    if let Some(v) = &vocab_file {
        let t = registry.tokenizer("GPT2BPETokenizer", json!({ "vocab_file": v, "merge_file": merge_file }))?;
        meta.tokenizer_fingerprint = Some(t.fingerprint());
        if t.vocab_size() != config.vocab_size {
            println!(
                "WARNING: config.json vocab_size {} differs from the tokenizer's {}",
                config.vocab_size,
                t.vocab_size()
            );
        }
    }
    let params = model.params();
    let path =
        megatron_checkpoint::save(&args.save, 0, &params, None, meta, backend.as_ref(), &ParallelContext::single())
            .with_context(|| format!("saving the imported checkpoint to {}", args.save.display()))?;
    println!(
        "imported {} ({} layers, hidden {}, vocab {} padded to {}) into {}",
        dir.display(),
        config.num_layers,
        config.hidden_size,
        config.vocab_size,
        model.padded_vocab_size(),
        path.display()
    );
    Ok(path)
}
