//! `megatron generate` for a Mamba/hybrid checkpoint (`megatron pretrain --model hybrid|mamba`
//! or `megatron import hf` of a transformers `Mamba2ForCausalLM`): recurrent decoding with
//! `megatron_hybrid::decode` (the conv and SSM states of every Mamba layer, constant memory
//! per token, next to the KV cache of the attention layers). The prompt is fed one token per
//! step through the same recurrence; `--no-kv-cache` instead recomputes the whole prefix with
//! the training forward every step (the reference path). Each prompt runs on its own.
//!
//! [`load_hybrid`] rebuilds the model: a checkpoint of `import hf` stores its whole
//! `HybridConfig` (`args.hybrid_config`); one of `pretrain` stores the pretrain flags, mapped
//! as `src/hybrid_args.rs` maps them.

use super::cli::{sampling_from, GenerateArgs};
use super::loader::{tokenizer_for, LoadArgs};
use anyhow::{bail, Context, Result};
use megatron_core::{Backend, Model, ParallelContext, Registry, Tokenizer};
use megatron_hybrid::{HybridConfig, HybridModel};
use rand::SeedableRng;
use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

/// A hybrid model ready for inference.
pub struct LoadedHybrid {
    pub model: HybridModel,
    pub tokenizer: Arc<dyn Tokenizer>,
    /// Unpadded vocabulary (samples stay below it).
    pub vocab_size: usize,
    pub eod: i32,
    pub args: Value,
    pub iteration: u64,
}

/// Whether `args` (a checkpoint's) describe a `hybrid` or `mamba` model.
pub fn is_hybrid_args(args: &Value) -> bool {
    matches!(args["model"].as_str(), Some("hybrid" | "mamba"))
}

/// Whether the checkpoint in `flags.load` holds a hybrid or Mamba model.
pub fn is_hybrid_checkpoint(flags: &LoadArgs) -> bool {
    megatron_checkpoint::load(&flags.load, flags.ckpt_step)
        .map(|c| is_hybrid_args(&c.metadata.meta.args))
        .unwrap_or(false)
}

/// The `HybridConfig` of a `megatron pretrain --model hybrid|mamba` checkpoint's flags.
fn config_from_pretrain_args(args: &Value, vocab_size: usize, dir: &Path) -> Result<HybridConfig> {
    let int = |k: &str| args[k].as_u64().map(|v| v as usize);
    let need = |k: &str| {
        int(k).with_context(|| format!("checkpoint {}: the hybrid args have no integer `{k}`", dir.display()))
    };
    let layers = need("num_layers")?;
    let pattern = match (args["hybrid_layer_pattern"].as_str(), args["hybrid_override_pattern"].as_str()) {
        (Some(p), _) | (None, Some(p)) => p.to_string(),
        (None, None) => megatron_hybrid::config::allocate_pattern(
            layers,
            args["hybrid_attention_ratio"].as_f64().unwrap_or(0.0),
            args["hybrid_mlp_ratio"].as_f64().unwrap_or(0.0),
        )?,
    };
    let mut c = HybridConfig::new(
        &pattern,
        need("hidden_size")?,
        need("num_attention_heads")?,
        need("seq_length")?,
        vocab_size,
    );
    c.ffn_hidden_size = int("ffn_hidden_size");
    let set = |dst: &mut usize, k: &str| {
        if let Some(v) = int(k) {
            *dst = v;
        }
    };
    set(&mut c.mamba_state_dim, "mamba_state_dim");
    set(&mut c.mamba_head_dim, "mamba_head_dim");
    set(&mut c.mamba_num_groups, "mamba_num_groups");
    set(&mut c.mamba_chunk_size, "mamba_chunk_size");
    c.mamba_num_heads = int("mamba_num_heads");
    if let Some(e) = args["norm_epsilon"].as_f64() {
        c.layernorm_epsilon = e as f32;
    }
    if let Some(n) = args["normalization"].as_str() {
        c.normalization = serde_json::from_value(json!(n))
            .with_context(|| format!("checkpoint {}: unknown normalization `{n}`", dir.display()))?;
    }
    c.untie_embeddings_and_output_weights = args["untie_embeddings_and_output_weights"].as_bool().unwrap_or(false);
    Ok(c)
}

/// Loads a hybrid/Mamba checkpoint (any TP/PP layout it was saved with) into a single-rank
/// model on the chosen backend.
pub fn load_hybrid(registry: &Registry, flags: &LoadArgs) -> Result<LoadedHybrid> {
    let dir = &flags.load;
    let ckpt = megatron_checkpoint::load(dir, flags.ckpt_step)
        .with_context(|| format!("opening checkpoint {} (--load)", dir.display()))?;
    let args = ckpt.metadata.meta.args.clone();
    if !is_hybrid_args(&args) {
        bail!("checkpoint {} does not hold a hybrid or mamba model", dir.display());
    }
    let tokenizer = tokenizer_for(registry, flags, &args)?;
    let padded = ckpt.entry("embedding.word_embeddings.weight")?.global_shape[0];
    let vocab_size = if args["mock_data"].as_bool() == Some(true) && args["tokenizer_type"].is_null() {
        args["vocab_size"].as_u64().context("a mock-data checkpoint records its vocab_size")? as usize
    } else {
        tokenizer.vocab_size()
    };
    let mut c = match args.get("hybrid_config").filter(|v| !v.is_null()) {
        Some(v) => serde_json::from_value::<HybridConfig>(v.clone()).with_context(|| {
            format!("checkpoint {}: args.hybrid_config is not a valid hybrid config", dir.display())
        })?,
        None => config_from_pretrain_args(&args, vocab_size, dir)?,
    };
    if c.vocab_size > padded {
        bail!("vocabulary {} is larger than the checkpoint's embedding ({padded} rows)", c.vocab_size);
    }
    // The stored rows are the padded vocabulary of the run (which depends on its tp): this
    // multiple gives exactly that size at tp = 1.
    c.make_vocab_size_divisible_by = padded;
    c.hidden_dropout = 0.0;
    c.attention_dropout = 0.0;
    let stored_layers = ckpt
        .metadata
        .tensors
        .keys()
        .filter_map(|k| k.strip_prefix("decoder.layers.")?.split('.').next()?.parse::<usize>().ok())
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    if stored_layers != c.layers()?.len() {
        bail!(
            "checkpoint {}: the args describe {} layers (`{}`), the stored tensors {stored_layers}",
            dir.display(),
            c.layers()?.len(),
            c.hybrid_layer_pattern
        );
    }
    let backend: Arc<dyn Backend> =
        registry.backend(&flags.backend, json!({ "threads": flags.threads })).context("building the backend")?;
    let name = if args["model"].as_str() == Some("mamba") { "mamba" } else { "hybrid" };
    let mut model = HybridModel::new(c, name, backend.clone(), ParallelContext::single())?;
    {
        let mut params = model.params_mut();
        ckpt.load_params(&mut params, backend.as_ref())
            .with_context(|| format!("loading weights from {}", dir.display()))?;
    }
    let eod = tokenizer.special_ids().eod.map_or(vocab_size.saturating_sub(1) as i32, |e| e as i32);
    Ok(LoadedHybrid { model, tokenizer, vocab_size, eod, args, iteration: ckpt.iteration() })
}

/// Generates up to `n` tokens after `prompt`, calling `emit` with each; returns the new ids
/// and the seconds spent on the prompt.
fn generate_one(
    loaded: &mut LoadedHybrid,
    prompt: &[i32],
    n: usize,
    recompute: bool,
    pick: &mut dyn FnMut(&[f32]) -> i32,
    stops: &[i32],
    emit: &mut dyn FnMut(i32),
) -> Result<(Vec<i32>, f64)> {
    let v = loaded.vocab_size;
    let t0 = std::time::Instant::now();
    let mut out = Vec::new();
    if recompute {
        let mut seq = prompt.to_vec();
        let mut prefill = 0.0;
        for i in 0..n {
            let logits = loaded.model.logits(&seq, 1, seq.len())?;
            let host = loaded.model.backend().to_host(&logits)?.to_f32_vec();
            let row = host.len() / seq.len();
            let id = pick(&host[(seq.len() - 1) * row..(seq.len() - 1) * row + v]);
            if i == 0 {
                prefill = t0.elapsed().as_secs_f64();
            }
            out.push(id);
            emit(id);
            if stops.contains(&id) {
                break;
            }
            seq.push(id);
        }
        return Ok((out, prefill));
    }
    let capacity = prompt.len() + n;
    let mut cache = loaded.model.new_cache(1, capacity)?;
    let mut logits = Vec::new();
    for &t in prompt {
        logits = loaded.model.decode_step(&[t], &mut cache)?;
    }
    let prefill = t0.elapsed().as_secs_f64();
    for i in 0..n {
        let id = pick(&logits[..v]);
        out.push(id);
        emit(id);
        if stops.contains(&id) || i + 1 == n {
            break;
        }
        logits = loaded.model.decode_step(&[id], &mut cache)?;
    }
    Ok((out, prefill))
}

pub fn run(args: &GenerateArgs, registry: &Registry) -> Result<()> {
    if args.chat {
        bail!("--chat is not supported for hybrid/mamba checkpoints yet");
    }
    let prompts: Vec<String> = match (&args.prompt, &args.prompts_file) {
        (Some(p), None) => vec![p.clone()],
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("reading --prompts-file {}", f.display()))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(String::from)
            .collect(),
        _ => bail!("give exactly one of --prompt TEXT or --prompts-file FILE"),
    };
    let sampling = sampling_from(args.temperature, args.top_k, args.top_p)?;
    let mut loaded = load_hybrid(registry, &args.load)?;
    let tok = loaded.tokenizer.clone();
    let mut stops = vec![loaded.eod];
    stops.extend(&args.stop_token);
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let mut top_p = sampling.top_p;
    let mut pick = |logits: &[f32]| {
        let id = megatron_serving::sampling::sample(logits, &sampling, top_p, &mut rng) as i32;
        top_p = sampling.decayed_top_p(top_p);
        id
    };
    for (r, p) in prompts.iter().enumerate() {
        let mut ids: Vec<i32> = if args.add_bos { vec![loaded.eod] } else { Vec::new() };
        ids.extend(tok.encode(p)?.into_iter().map(|t| t as i32));
        if ids.is_empty() {
            bail!("prompt {p:?} tokenizes to nothing; give text or --add-bos");
        }
        let mut out = std::io::stdout().lock();
        let mut so_far: Vec<u32> = ids.iter().map(|&t| t as u32).collect();
        let mut printed = tok.decode(&so_far)?;
        if prompts.len() > 1 {
            write!(out, "[{r}] ")?;
        }
        write!(out, "{printed}")?;
        out.flush()?;
        let mut emit = |token: i32| {
            so_far.push(token as u32);
            let text = tok.decode(&so_far).unwrap_or_default();
            if let Some(new) = text.strip_prefix(printed.as_str()).filter(|_| !text.ends_with('\u{FFFD}')) {
                let _ = write!(out, "{new}");
                let _ = out.flush();
                printed = text;
            }
        };
        let t0 = std::time::Instant::now();
        let (new, prefill) =
            generate_one(&mut loaded, &ids, args.tokens_to_generate, args.no_kv_cache, &mut pick, &stops, &mut emit)?;
        let secs = t0.elapsed().as_secs_f64() - prefill;
        writeln!(std::io::stdout())?;
        eprintln!(
            "{}: prompt {} tokens in {:.2}s, generated {} tokens in {secs:.3}s ({:.2} ms/token, {}); ids {new:?}",
            loaded.model.name(),
            ids.len(),
            prefill,
            new.len(),
            1e3 * secs / new.len().saturating_sub(1).max(1) as f64,
            if args.no_kv_cache { "full recompute" } else { "recurrent state" },
        );
    }
    Ok(())
}
