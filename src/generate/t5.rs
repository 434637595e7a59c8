//! `megatron generate` for a T5 checkpoint (`megatron pretrain --model t5` or `megatron import
//! hf` of a `T5ForConditionalGeneration`): the prompt is the encoder input, encoded once; the
//! decoder starts from the decoder start token and runs with the KV caches of
//! `megatron_t5::decode` (`--no-kv-cache`: the full recompute of `megatron_t5::generate`,
//! greedy only). Tokens stream to stdout as they are produced.
//!
//! [`load_t5`] rebuilds the model: a checkpoint of `import hf` stores its whole `T5Config`
//! (`args.t5_config`, with the options Megatron has no flags for: activation, head scaling);
//! one of `pretrain` stores the pretrain flags, mapped as `src/t5_args.rs` maps them.

use super::cli::{sampling_from, GenerateArgs};
use super::loader::LoadArgs;
use anyhow::{bail, Context, Result};
use megatron_core::{Backend, Model, ParallelContext, Registry, Tokenizer};
use megatron_t5::{T5Config, T5Model};
use rand::SeedableRng;
use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

/// A T5 model ready for inference.
pub struct LoadedT5 {
    pub model: T5Model,
    pub tokenizer: Arc<dyn Tokenizer>,
    /// The checkpoint's args.
    pub args: Value,
    pub iteration: u64,
    /// First decoder input (`decoder_start_token_id`; Megatron's T5 data: the tokenizer's bos).
    pub decoder_start: i32,
    /// Generation stops after it (`eos_token_id`; Megatron's: the tokenizer's eos).
    pub eos: Option<i32>,
}

/// Whether the checkpoint in `dir` holds a T5 model (its args say `model: t5`).
pub fn is_t5_checkpoint(flags: &LoadArgs) -> bool {
    megatron_checkpoint::load(&flags.load, flags.ckpt_step)
        .map(|c| c.metadata.meta.args["model"].as_str() == Some("t5"))
        .unwrap_or(false)
}

fn usize_arg(args: &Value, key: &str, dir: &Path) -> Result<usize> {
    args[key].as_u64().map(|v| v as usize).with_context(|| {
        format!("checkpoint {}: the t5 args have no integer `{key}`; was it saved by megatron-rs?", dir.display())
    })
}

/// The `T5Config` of a `megatron pretrain --model t5` checkpoint's flags.
fn config_from_pretrain_args(args: &Value, vocab_size: usize, dir: &Path) -> Result<T5Config> {
    let opt = |k: &str| args[k].as_u64().map(|v| v as usize);
    let layers = usize_arg(args, "num_layers", dir)?;
    let seq = usize_arg(args, "seq_length", dir)?;
    let mut c = T5Config::new(
        opt("encoder_num_layers").unwrap_or(layers),
        usize_arg(args, "hidden_size", dir)?,
        usize_arg(args, "num_attention_heads", dir)?,
        opt("encoder_seq_length").unwrap_or(seq),
        opt("decoder_seq_length").unwrap_or(128),
        vocab_size,
    );
    c.decoder_num_layers = opt("decoder_num_layers").unwrap_or(layers);
    c.kv_channels = opt("kv_channels");
    c.ffn_hidden_size = opt("ffn_hidden_size");
    if let Some(m) = opt("make_vocab_size_divisible_by") {
        c.make_vocab_size_divisible_by = m;
    }
    if let Some(e) = args["norm_epsilon"].as_f64() {
        c.layernorm_epsilon = e as f32;
    }
    if let Some(n) = args["normalization"].as_str() {
        c.normalization = serde_json::from_value(json!(n))
            .with_context(|| format!("checkpoint {}: unknown normalization `{n}`", dir.display()))?;
    }
    if let Some(p) = args["position_embedding_type"].as_str() {
        c.position_embedding_type = p.to_string();
    }
    if let Some(b) = opt("relative_attention_num_buckets") {
        c.relative_attention_num_buckets = b;
    }
    if let Some(d) = opt("relative_attention_max_distance") {
        c.relative_attention_max_distance = d;
    }
    c.add_bias_linear = args["disable_bias_linear"].as_bool() != Some(true);
    Ok(c)
}

/// The tokenizer named by the flags, else by the checkpoint's args (BERT WordPiece with its
/// extra ids for Megatron's T5, a Hugging Face `tokenizer.json`, or ids for a NullTokenizer).
fn tokenizer_for_t5(registry: &Registry, flags: &LoadArgs, args: &Value) -> Result<Arc<dyn Tokenizer>> {
    let ty = flags
        .tokenizer_type
        .clone()
        .or_else(|| args["tokenizer_type"].as_str().map(String::from))
        .context("the checkpoint's args name no tokenizer_type; pass --tokenizer-type")?;
    let path = |flag: &Option<std::path::PathBuf>, key: &str| -> Option<Value> {
        flag.as_ref().map(|p| json!(p)).or_else(|| args.get(key).filter(|v| !v.is_null()).cloned())
    };
    let mut config = serde_json::Map::new();
    match ty.as_str() {
        "NullTokenizer" => {
            let v =
                args["vocab_size"].as_u64().context("NullTokenizer needs the checkpoint's vocab_size in its args")?;
            config.insert("vocab_size".into(), json!(v));
        }
        "HuggingFaceTokenizer" => {
            config
                .insert("tokenizer_model".into(), path(&flags.tokenizer_model, "tokenizer_model").unwrap_or_default());
        }
        _ => {
            config.insert("vocab_file".into(), path(&flags.vocab_file, "vocab_file").unwrap_or_default());
            if let Some(m) = path(&flags.merge_file, "merge_file") {
                config.insert("merge_file".into(), m);
            }
            if let Some(x) = args["vocab_extra_ids"].as_u64().filter(|&x| x > 0) {
                config.insert("vocab_extra_ids".into(), json!(x));
            }
        }
    }
    registry.tokenizer(&ty, Value::Object(config)).with_context(|| {
        format!("building the checkpoint's tokenizer {ty} (pass --tokenizer-type/--vocab-file to override)")
    })
}

/// Loads a T5 checkpoint into a tp = 1 model on the chosen backend, sized for encoder inputs
/// of `enc_seq` and decoder rows of `dec_seq` tokens (only the full recompute uses them).
pub fn load_t5(registry: &Registry, flags: &LoadArgs, enc_seq: usize, dec_seq: usize) -> Result<LoadedT5> {
    let dir = &flags.load;
    let ckpt = megatron_checkpoint::load(dir, flags.ckpt_step)
        .with_context(|| format!("opening checkpoint {} (--load)", dir.display()))?;
    let args = ckpt.metadata.meta.args.clone();
    if args["model"].as_str() != Some("t5") {
        bail!("checkpoint {} does not hold a t5 model", dir.display());
    }
    let tokenizer = tokenizer_for_t5(registry, flags, &args)?;
    let emb = ckpt.entry("embedding.word_embeddings.weight")?.global_shape.clone();
    let mut c = match args.get("t5_config").filter(|v| !v.is_null()) {
        Some(v) => serde_json::from_value::<T5Config>(v.clone())
            .with_context(|| format!("checkpoint {}: args.t5_config is not a valid t5 config", dir.display()))?,
        None => config_from_pretrain_args(&args, tokenizer.vocab_size(), dir)?,
    };
    // Nothing is allocated from the args alone: the stored tensors must agree with them.
    let layers = |stack: &str| {
        ckpt.metadata
            .tensors
            .keys()
            .filter_map(|k| k.strip_prefix(stack)?.split('.').next()?.parse::<usize>().ok())
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    };
    let (ne, nd) = (layers("encoder.layers."), layers("decoder.layers."));
    if emb.len() != 2 || emb[1] != c.hidden_size || ne != c.encoder_num_layers || nd != c.decoder_num_layers {
        bail!(
            "checkpoint {}: args say hidden {} with {}+{} layers, the stored tensors have embedding {emb:?} and \
             {ne}+{nd} layers: the metadata does not match the weights",
            dir.display(),
            c.hidden_size,
            c.encoder_num_layers,
            c.decoder_num_layers
        );
    }
    if c.vocab_size > emb[0] {
        bail!("tokenizer vocabulary {} is larger than the checkpoint's embedding ({} rows)", c.vocab_size, emb[0]);
    }
    c.padded_vocab_size = Some(emb[0]);
    if let Ok(p) = ckpt.entry("embedding.position_embeddings.weight") {
        c.max_position_embeddings = p.global_shape[0];
    }
    if !c.relative() && enc_seq.max(dec_seq) > c.max_position_embeddings {
        bail!(
            "the prompt ({enc_seq} tokens) or the decoder row ({dec_seq}) is longer than the model's {} learned positions",
            c.max_position_embeddings
        );
    }
    c.encoder_seq_length = enc_seq;
    c.decoder_seq_length = dec_seq;
    c.max_position_embeddings = c.max_position_embeddings.max(if c.relative() { enc_seq.max(dec_seq) } else { 0 });
    c.hidden_dropout = 0.0;
    c.attention_dropout = 0.0;
    let backend: Arc<dyn Backend> =
        registry.backend(&flags.backend, json!({ "threads": flags.threads })).context("building the backend")?;
    let mut model = T5Model::new(c, backend.clone(), ParallelContext::single())?;
    {
        let mut params = model.params_mut();
        ckpt.load_params(&mut params, backend.as_ref())
            .with_context(|| format!("loading weights from {}", dir.display()))?;
    }
    let special = tokenizer.special_ids();
    let id = |key: &str, fallback: Option<u32>| args[key].as_i64().map(|v| v as i32).or(fallback.map(|v| v as i32));
    let decoder_start = id("decoder_start_token_id", special.bos)
        .context("the checkpoint names no decoder_start_token_id and its tokenizer has no bos")?;
    let eos = id("eos_token_id", special.eos);
    Ok(LoadedT5 { model, tokenizer, args, iteration: ckpt.iteration(), decoder_start, eos })
}

pub fn run(args: &GenerateArgs, registry: &Registry) -> Result<()> {
    let prompt = match (&args.prompt, &args.prompts_file) {
        (Some(p), None) => p.clone(),
        _ => bail!("t5 generation takes one --prompt TEXT (the encoder input)"),
    };
    if args.chat {
        bail!("--chat is for decoder-only chat models, not t5");
    }
    let sampling = sampling_from(args.temperature, args.top_k, args.top_p)?;
    if args.no_kv_cache && sampling.top_k != 1 {
        bail!("--no-kv-cache (full recompute) decodes greedily only: add --top-k 1");
    }
    // The tokenizer comes first (the encoder length is the prompt's); the model is sized then.
    let n = args.tokens_to_generate;
    let probe = megatron_checkpoint::load(&args.load.load, args.load.ckpt_step)
        .with_context(|| format!("opening checkpoint {} (--load)", args.load.load.display()))?;
    let tok = tokenizer_for_t5(registry, &args.load, &probe.metadata.meta.args)?;
    let enc: Vec<i32> = tok.encode(&prompt)?.into_iter().map(|t| t as i32).collect();
    if enc.is_empty() {
        bail!("prompt {prompt:?} tokenizes to nothing");
    }
    let mut loaded = load_t5(registry, &args.load, enc.len(), n + 1)?;
    let mut stops: Vec<i32> = loaded.eos.into_iter().collect();
    stops.extend(&args.stop_token);
    let mut out = std::io::stdout().lock();
    let mut printed = String::new();
    let mut so_far: Vec<u32> = Vec::new();
    let t0 = std::time::Instant::now();
    let mut emit = |token: i32| {
        so_far.push(token as u32);
        let text = tok.decode(&so_far).unwrap_or_default();
        if let Some(new) = text.strip_prefix(printed.as_str()).filter(|_| !text.ends_with('\u{FFFD}')) {
            let _ = write!(out, "{new}");
            let _ = out.flush();
            printed = text;
        }
    };
    let dec = if args.no_kv_cache {
        // Full recompute (the reference path): printed when done.
        let mut dec = megatron_t5::generate::greedy(&mut loaded.model, &enc, loaded.decoder_start, loaded.eos, n)?;
        if let Some(p) = dec.iter().skip(1).position(|t| stops.contains(t)) {
            dec.truncate(p + 2);
        }
        dec[1..].iter().for_each(|&t| emit(t));
        dec
    } else {
        let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
        let mut top_p = sampling.top_p;
        let mut pick = |logits: &[f32]| -> Result<i32> {
            let id = megatron_serving::sampling::sample(logits, &sampling, top_p, &mut rng) as i32;
            top_p = sampling.decayed_top_p(top_p);
            Ok(id)
        };
        megatron_t5::decode::decode_with(
            &mut loaded.model,
            &enc,
            loaded.decoder_start,
            &stops,
            n,
            &mut pick,
            &mut emit,
        )?
    };
    let secs = t0.elapsed().as_secs_f64();
    writeln!(std::io::stdout())?;
    let count = dec.len() - 1;
    eprintln!(
        "t5: encoder {} tokens, generated {count} tokens in {secs:.2}s ({:.1} ms/token, kv cache {}); ids {:?}",
        enc.len(),
        1e3 * secs / count.max(1) as f64,
        if args.no_kv_cache { "off" } else { "on" },
        dec
    );
    Ok(())
}
