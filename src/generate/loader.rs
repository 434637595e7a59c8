//! Rebuilds a GPT model and its tokenizer from a megatron-rs checkpoint: the checkpoint's
//! `args` (the training flags) give the model shape and tokenizer, the stored word embedding
//! gives the padded vocabulary, and the weights are cut from the stored shards (any TP layout
//! the checkpoint was saved with loads into this tp = 1 model).

use anyhow::{bail, Context, Result};
use clap::Args;
use megatron_core::{Backend, ParallelContext, Registry, Tokenizer};
use megatron_gpt::{GptConfig, GptModel};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Flags shared by `generate`, `serve` and `export`: where the checkpoint is, and tokenizer
/// overrides for checkpoints whose args do not name usable tokenizer files.
#[derive(Args, Clone, Debug, Default)]
pub struct LoadArgs {
    /// Checkpoint directory (a `--save` directory of `megatron pretrain` or `import hf`).
    #[arg(long)]
    pub load: PathBuf,
    /// Iteration to load (default: the latest, from latest_checkpointed_iteration.txt).
    #[arg(long)]
    pub ckpt_step: Option<u64>,
    #[arg(long)]
    pub tokenizer_type: Option<String>,
    #[arg(long)]
    pub vocab_file: Option<PathBuf>,
    #[arg(long)]
    pub merge_file: Option<PathBuf>,
    /// `tokenizer.json` (or its directory) of `--tokenizer-type HuggingFaceTokenizer`.
    #[arg(long)]
    pub tokenizer_model: Option<PathBuf>,
    /// Compute backend plugin.
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// Worker threads of the CPU backend (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// A model ready for inference, with what generation needs to know about its vocabulary.
pub struct LoadedModel {
    pub model: GptModel,
    pub tokenizer: Arc<dyn Tokenizer>,
    /// Unpadded vocabulary the model was trained with (samples stay below it).
    pub vocab_size: usize,
    /// End-of-document id (generation stops at it and pads with it).
    pub eod: i32,
    /// The checkpoint's training args.
    pub args: Value,
    pub iteration: u64,
}

fn arg_usize(args: &Value, key: &str, dir: &Path) -> Result<usize> {
    args[key].as_u64().map(|v| v as usize).with_context(|| {
        format!("checkpoint {}: metadata args have no integer `{key}`; was it saved by megatron-rs?", dir.display())
    })
}

/// The `GptConfig` a checkpoint's args describe, with `vocab_size` and the padded size given.
pub fn gpt_config_from_args(args: &Value, vocab_size: usize, padded: usize, dir: &Path) -> Result<GptConfig> {
    if let Some(model) = args["model"].as_str() {
        if model != "gpt" {
            bail!("checkpoint {} holds a `{model}` model; generation supports `gpt` only", dir.display());
        }
    }
    let seq = arg_usize(args, "seq_length", dir)?;
    let mut c = GptConfig::new(
        arg_usize(args, "num_layers", dir)?,
        arg_usize(args, "hidden_size", dir)?,
        arg_usize(args, "num_attention_heads", dir)?,
        seq,
        vocab_size,
    );
    c.ffn_hidden_size = args["ffn_hidden_size"].as_u64().map(|v| v as usize);
    c.max_position_embeddings = args["max_position_embeddings"].as_u64().map_or(seq, |v| v as usize);
    c.padded_vocab_size = Some(padded);
    if let Some(m) = args["make_vocab_size_divisible_by"].as_u64() {
        c.make_vocab_size_divisible_by = m as usize;
    }
    if let Some(eps) = args["norm_epsilon"].as_f64() {
        c.layernorm_epsilon = eps as f32;
    }
    if let Some(n) = args["normalization"].as_str() {
        c.normalization = serde_json::from_value(json!(n))
            .with_context(|| format!("checkpoint {}: unknown normalization `{n}`", dir.display()))?;
    }
    c.swiglu = args["swiglu"].as_bool().unwrap_or(false);
    c.untie_embeddings_and_output_weights = args["untie_embeddings_and_output_weights"].as_bool().unwrap_or(false);
    if let Some(b) = args["add_bias_linear"].as_bool() {
        c.add_bias_linear = b;
    }
    if args["disable_bias_linear"].as_bool() == Some(true) {
        c.add_bias_linear = false;
    }
    c.add_qkv_bias = args["add_qkv_bias"].as_bool().unwrap_or(false);
    if let Some(p) = args["position_embedding_type"].as_str() {
        c.position_embedding_type = p.to_string();
    }
    if let Some(v) = args["rotary_base"].as_f64() {
        c.rotary_base = v as f32;
    }
    if let Some(v) = args["rotary_percent"].as_f64() {
        c.rotary_percent = v as f32;
    }
    c.rotary_interleaved = args["rotary_interleaved"].as_bool().unwrap_or(false);
    c.rope_scaling = crate::llama_args::rope_scaling_from_stored_args(args)
        .with_context(|| format!("checkpoint {}", dir.display()))?;
    c.qk_layernorm = args["qk_layernorm"].as_bool().unwrap_or(false);
    if args["group_query_attention"].as_bool() == Some(true) {
        c.num_query_groups = args["num_query_groups"].as_u64().map(|v| v as usize);
    }
    c.kv_channels = args["kv_channels"].as_u64().map(|v| v as usize);
    c.hidden_dropout = 0.0;
    c.attention_dropout = 0.0;
    Ok(c)
}

/// Checks that `config` (built from a checkpoint's stored args) describes exactly the model
/// tensors the checkpoint stores: the layer count first (so a `num_layers` of 10⁶ costs
/// nothing), then every parameter's name, global shape and float dtype, and no stored model
/// tensor left over. [`megatron_checkpoint::load`] has already checked every stored tensor
/// against its shard file's header and byte range, so after this the model to be allocated is
/// no larger than the checkpoint on disk.
pub fn check_config_against_tensors(
    config: &GptConfig,
    padded: usize,
    ckpt: &megatron_checkpoint::LoadedCheckpoint,
) -> Result<()> {
    let meta = ckpt.dir().join("metadata.json");
    let stored = check_layer_count(config, ckpt)?;
    let expected = megatron_gpt::gpt_param_shapes(config, padded);
    for (name, shape) in &expected {
        let Some(entry) = ckpt.metadata.tensors.get(name) else {
            bail!(
                "{}: the args describe parameter `{name}` {shape:?}, but the checkpoint has no such tensor \
                 (architecture flags in the metadata do not match the stored weights)",
                meta.display()
            );
        };
        if &entry.global_shape != shape {
            bail!(
                "{}: tensor `{name}` is stored as {:?}, but the args (hidden_size {}, ffn_hidden_size {}, \
                 max_position_embeddings {}, padded vocabulary {padded}) need {shape:?}",
                meta.display(),
                entry.global_shape,
                config.hidden_size,
                config.ffn_hidden_size.map_or("default".to_string(), |f| f.to_string()),
                config.max_position_embeddings
            );
        }
        if !["F32", "BF16", "F16"].contains(&entry.dtype.as_str()) {
            bail!("{}: tensor `{name}` has dtype {}, expected a float type", meta.display(), entry.dtype);
        }
    }
    if stored.len() != expected.len() {
        let known: std::collections::BTreeSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
        let extra: Vec<&str> = stored.iter().map(|(k, _)| k.as_str()).filter(|k| !known.contains(k)).take(3).collect();
        bail!(
            "{}: the checkpoint stores tensors the args' model does not have (e.g. {extra:?}); its args \
             (swiglu, normalization, untie_embeddings_and_output_weights, add_bias_linear) do not match the weights",
            meta.display()
        );
    }
    Ok(())
}

/// The stored model tensors, after checking that they hold exactly `config.num_layers`
/// contiguous decoder layers (before anything is allocated from the args).
fn check_layer_count<'a>(
    config: &GptConfig,
    ckpt: &'a megatron_checkpoint::LoadedCheckpoint,
) -> Result<Vec<(&'a String, &'a megatron_checkpoint::TensorEntry)>> {
    let meta = ckpt.dir().join("metadata.json");
    let stored: Vec<(&String, &megatron_checkpoint::TensorEntry)> = ckpt
        .metadata
        .tensors
        .iter()
        .filter(|(k, _)| !k.starts_with(megatron_checkpoint::metadata::OPTIMIZER_PREFIX))
        .collect();
    let layers: std::collections::BTreeSet<usize> =
        stored.iter().filter_map(|(k, _)| k.strip_prefix("decoder.layers.")?.split('.').next()?.parse().ok()).collect();
    let contiguous = layers.iter().enumerate().all(|(i, &l)| i == l);
    if layers.len() != config.num_layers || !contiguous {
        bail!(
            "{}: args say num_layers {}, but the checkpoint stores {} decoder layers{}: the metadata is \
             corrupted or belongs to another checkpoint",
            meta.display(),
            config.num_layers,
            layers.len(),
            if contiguous { String::new() } else { format!(" with gaps ({layers:?})") }
        );
    }
    Ok(stored)
}

/// An MoE checkpoint (`num_experts` in its args): the GPT whose MLP slots the registry's `moe`
/// plugin fills, checked to hold exactly the stored tensors (names here, shapes in
/// `load_params`).
fn build_moe_model(
    registry: &Registry,
    config: GptConfig,
    moe: Value,
    backend: Arc<dyn Backend>,
    ckpt: &megatron_checkpoint::LoadedCheckpoint,
) -> Result<GptModel> {
    let stored = check_layer_count(&config, ckpt)?;
    let provider = registry.mlp_provider("moe", moe).with_context(|| {
        format!(
            "checkpoint {} is a Mixture-of-Experts model (num_experts in its args): load the plugin with \
             `megatron --plugin libmegatron_moe.so ...` or build megatron with --features moe",
            ckpt.dir().display()
        )
    })?;
    let spec =
        megatron_transformer::WithMlpProvider { inner: &megatron_transformer::LocalSpecProvider, mlp: &provider };
    let model = GptModel::with_provider(config, backend, ParallelContext::single(), &spec)?;
    let mut params = megatron_core::Model::params(&model);
    params.extend(megatron_core::Model::buffers(&model));
    let names: std::collections::BTreeSet<&str> = params.iter().map(|p| p.name.as_str()).collect();
    let extra: Vec<&str> = stored.iter().map(|(k, _)| k.as_str()).filter(|k| !names.contains(k)).take(3).collect();
    if !extra.is_empty() {
        bail!(
            "{}: the checkpoint stores tensors the args' MoE model does not have (e.g. {extra:?}): its MoE args \
             (num_experts, moe_layer_freq, moe_shared_expert_intermediate_size) do not match the weights",
            ckpt.dir().join("metadata.json").display()
        );
    }
    Ok(model)
}

/// The tokenizer named by the flags, else by the checkpoint's args; a checkpoint trained on
/// mock data without one gets a `NullTokenizer` over its vocabulary (prompts are ids).
pub fn tokenizer_for(registry: &Registry, flags: &LoadArgs, args: &Value) -> Result<Arc<dyn Tokenizer>> {
    let path_arg = |flag: &Option<PathBuf>, key: &str| -> Option<Value> {
        flag.as_ref().map(|p| json!(p)).or_else(|| args.get(key).filter(|v| !v.is_null()).cloned())
    };
    let ty = flags.tokenizer_type.clone().or_else(|| args["tokenizer_type"].as_str().map(String::from));
    let ty = match ty {
        Some(t) => t,
        None if args["mock_data"].as_bool() == Some(true) => "NullTokenizer".to_string(),
        None => "GPT2BPETokenizer".to_string(),
    };
    let config = if ty == "HuggingFaceTokenizer" {
        json!({ "tokenizer_model": path_arg(&flags.tokenizer_model, "tokenizer_model") })
    } else if ty == "NullTokenizer" {
        let v = args["vocab_size"].as_u64().context("NullTokenizer needs the checkpoint's --vocab-size in its args")?;
        json!({ "vocab_size": v })
    } else {
        json!({ "vocab_file": path_arg(&flags.vocab_file, "vocab_file"), "merge_file": path_arg(&flags.merge_file, "merge_file") })
    };
    registry.tokenizer(&ty, config).with_context(|| {
        format!(
            "building the checkpoint's tokenizer {ty} (pass --tokenizer-type/--vocab-file/--merge-file to override)"
        )
    })
}

/// Loads `flags.load` into a tp = 1 GPT on the chosen backend.
pub fn load_model(registry: &Registry, flags: &LoadArgs) -> Result<LoadedModel> {
    load_model_on(registry, flags, ParallelContext::single())
}

/// Loads this rank's shard (`ctx`: its tensor-parallel slice of its pipeline stage's layers)
/// of `flags.load`, whatever TP layout the checkpoint was saved with.
pub fn load_model_on(registry: &Registry, flags: &LoadArgs, ctx: ParallelContext) -> Result<LoadedModel> {
    let dir = &flags.load;
    let ckpt = megatron_checkpoint::load(dir, flags.ckpt_step)
        .with_context(|| format!("opening checkpoint {} (--load)", dir.display()))?;
    let args = ckpt.metadata.meta.args.clone();
    let tokenizer = tokenizer_for(registry, flags, &args)?;
    let padded = ckpt.entry("embedding.word_embeddings.weight")?.global_shape[0];
    // The model's vocabulary is the one it was trained with; a NullTokenizer adds its eod.
    let vocab_size = if args["mock_data"].as_bool() == Some(true) && args["tokenizer_type"].is_null() {
        arg_usize(&args, "vocab_size", dir)?
    } else {
        tokenizer.vocab_size()
    };
    if vocab_size > padded {
        bail!(
            "tokenizer vocabulary {vocab_size} is larger than the checkpoint's embedding ({padded} rows): \
             wrong --vocab-file for {}?",
            dir.display()
        );
    }
    let config = gpt_config_from_args(&args, vocab_size, padded, dir)?;
    let moe = crate::moe_args::plugin_config_from_stored_args(&args);
    // Nothing is allocated from the metadata's word alone: the model the args describe must be
    // exactly the tensors stored (whose sizes were checked against the shard files).
    if moe.is_none() {
        check_config_against_tensors(&config, padded, &ckpt)?;
    }
    let backend: Arc<dyn Backend> =
        registry.backend(&flags.backend, json!({ "threads": flags.threads })).context("building the backend")?;
    let mut model = match moe {
        None => GptModel::new(config, backend.clone(), ctx)?,
        Some(_) if ctx.world_size() > 1 => bail!(
            "{} is a Mixture-of-Experts model: it loads on one rank only here (drop --nproc and the \
             parallel sizes)",
            dir.display()
        ),
        Some(moe) => build_moe_model(registry, config, moe, backend.clone(), &ckpt)?,
    };
    {
        let mut params = megatron_core::Model::params_mut(&mut model);
        ckpt.load_params(&mut params, backend.as_ref())
            .with_context(|| format!("loading weights from {}", dir.display()))?;
    }
    let missing = ckpt.load_buffers(megatron_core::Model::buffers_mut(&mut model), backend.as_ref())?;
    if !missing.is_empty() {
        println!(
            "WARNING: {} does not store {} (e.g. `{}`, saved by an older megatron): routing uses its initial value",
            dir.display(),
            missing.len(),
            missing[0]
        );
    }
    let eod = tokenizer.special_ids().eod.map_or(vocab_size.saturating_sub(1) as i32, |e| e as i32);
    Ok(LoadedModel { model, tokenizer, vocab_size, eod, args, iteration: ckpt.iteration() })
}
