//! `megatron import gguf --gguf FILE --save CKPT`: a llama.cpp GGUF file (architectures
//! `llama`, which covers Mistral, and `qwen2`) becomes a megatron-rs checkpoint at iteration 0
//! with the tokenizer built from the file's metadata, so `generate` (and `--chat`) need no
//! other file.
//!
//! Weights are dequantized to f32 (see `megatron_gguf::dequant`), renamed to HF Llama names
//! and loaded through `megatron_gpt::hf_llama`. llama.cpp's converter permutes the `llama` q/k
//! rows of every head from HF's halves layout to interleaved pairs; we undo it (as
//! transformers does) so our rotary is the non-interleaved HF one. `qwen2` files are not
//! permuted.
//!
//! The tokenizer (`tokenizer.ggml.model = gpt2`, byte-level BPE) is written as a Hugging Face
//! `tokenizer.json` the way transformers converts GGUF tokenizers (byte-level pre-tokenizer
//! and decoder, the control tokens as special added tokens), plus a `tokenizer_config.json`
//! with the special tokens and the chat template.

use anyhow::{bail, Context, Result};
use clap::Args;
use megatron_checkpoint::CheckpointMeta;
use megatron_core::{Backend, Model, ParallelContext, Registry};
use megatron_gguf::GgufFile;
use megatron_gpt::{load_hf_llama, GptConfig, GptModel};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Args, Clone, Debug)]
pub struct ImportGgufArgs {
    /// The GGUF file.
    #[arg(long)]
    pub gguf: PathBuf,
    /// Checkpoint directory to create (`iter_0000000` inside, the tokenizer in `tokenizer/`).
    #[arg(long)]
    pub save: PathBuf,
    /// Megatron's vocabulary padding multiple.
    #[arg(long, default_value_t = 128)]
    pub make_vocab_size_divisible_by: usize,
    /// Sequence length recorded in the checkpoint args (default: the model's context length).
    #[arg(long)]
    pub seq_length: Option<usize>,
}

/// The GPT config a GGUF file's `{arch}.*` metadata describes.
pub fn gpt_config_from_gguf(f: &GgufFile, divisible_by: usize, seq: Option<usize>) -> Result<GptConfig> {
    let arch = f.str("general.architecture")?;
    if !matches!(arch, "llama" | "qwen2" | "mistral") {
        bail!("GGUF architecture `{arch}` is not supported (llama, mistral, qwen2 are)");
    }
    let key = |k: &str| format!("{arch}.{k}");
    let u = |k: &str| -> Result<usize> { Ok(f.u64(&key(k))? as usize) };
    let (layers, hidden, heads) = (u("block_count")?, u("embedding_length")?, u("attention.head_count")?);
    let kv_heads = f.get(&key("attention.head_count_kv")).and_then(|v| v.as_u64()).map_or(heads, |v| v as usize);
    let vocab = match f.get(&key("vocab_size")).and_then(|v| v.as_u64()) {
        Some(v) => v as usize,
        None => f.strings("tokenizer.ggml.tokens")?.len(),
    };
    let ctx = u("context_length")?;
    let mut c = GptConfig::new(layers, hidden, heads, seq.unwrap_or(ctx), vocab);
    c.max_position_embeddings = ctx.max(c.seq_length);
    c.ffn_hidden_size = Some(u("feed_forward_length")?);
    c.make_vocab_size_divisible_by = divisible_by;
    c.normalization = megatron_transformer::NormKind::RMSNorm;
    c.layernorm_epsilon = f.f64(&key("attention.layer_norm_rms_epsilon"))? as f32;
    c.swiglu = true;
    c.add_bias_linear = false;
    c.add_qkv_bias = f.tensor("blk.0.attn_q.bias").is_some();
    c.position_embedding_type = "rope".into();
    c.rotary_base = f.get(&key("rope.freq_base")).and_then(|v| v.as_f64()).unwrap_or(10000.0) as f32;
    if let Some(t) = f.get(&key("rope.scaling.type")).and_then(|v| v.as_str()) {
        if t != "none" {
            bail!("GGUF rope scaling `{t}` is not supported yet; only unscaled rotary embeddings import");
        }
    }
    if kv_heads != heads {
        c.num_query_groups = Some(kv_heads);
    }
    let head_dim = f.get(&key("attention.key_length")).and_then(|v| v.as_u64()).map(|v| v as usize);
    if let Some(hd) = head_dim.filter(|&hd| hd * heads != hidden) {
        c.kv_channels = Some(hd);
    }
    let hd = head_dim.unwrap_or(hidden / heads.max(1));
    if let Some(rot) = f.get(&key("rope.dimension_count")).and_then(|v| v.as_u64()) {
        c.rotary_percent = rot as f32 / hd as f32;
    }
    c.untie_embeddings_and_output_weights = f.tensor("output.weight").is_some();
    c.hidden_dropout = 0.0;
    c.attention_dropout = 0.0;
    Ok(c)
}

/// The GGUF tensor holding HF tensor `hf`, and whether its rows are llama.cpp's rotary
/// permutation of `heads` heads.
fn gguf_name(hf: &str, c: &GptConfig, permuted: bool) -> Result<(String, Option<usize>)> {
    let fixed = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ];
    if let Some((_, g)) = fixed.iter().find(|(h, _)| *h == hf) {
        return Ok((g.to_string(), None));
    }
    let rest = hf.strip_prefix("model.layers.").with_context(|| format!("no GGUF name for HF tensor `{hf}`"))?;
    let (layer, leaf) = rest.split_once('.').with_context(|| format!("no GGUF name for HF tensor `{hf}`"))?;
    let groups = c.num_query_groups.unwrap_or(c.num_attention_heads);
    let (name, perm) = match leaf {
        "input_layernorm.weight" => ("attn_norm.weight", None),
        "self_attn.q_proj.weight" => ("attn_q.weight", Some(c.num_attention_heads)),
        "self_attn.k_proj.weight" => ("attn_k.weight", Some(groups)),
        "self_attn.v_proj.weight" => ("attn_v.weight", None),
        "self_attn.q_proj.bias" => ("attn_q.bias", Some(c.num_attention_heads)),
        "self_attn.k_proj.bias" => ("attn_k.bias", Some(groups)),
        "self_attn.v_proj.bias" => ("attn_v.bias", None),
        "self_attn.o_proj.weight" => ("attn_output.weight", None),
        "post_attention_layernorm.weight" => ("ffn_norm.weight", None),
        "mlp.gate_proj.weight" => ("ffn_gate.weight", None),
        "mlp.up_proj.weight" => ("ffn_up.weight", None),
        "mlp.down_proj.weight" => ("ffn_down.weight", None),
        _ => bail!("no GGUF name for HF tensor `{hf}`"),
    };
    Ok((format!("blk.{layer}.{name}"), perm.filter(|_| permuted)))
}

/// Undoes llama.cpp's `permute`: GGUF row `h·hd + 2i + j` holds HF row `h·hd + j·hd/2 + i`.
pub fn unpermute_rows(data: &[f32], heads: usize, row_len: usize) -> Result<Vec<f32>> {
    let rows = data.len() / row_len.max(1);
    if heads == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
        bail!("{rows} rows cannot be un-permuted as {heads} rotary heads");
    }
    let hd = rows / heads;
    let mut out = vec![0.0; data.len()];
    for h in 0..heads {
        for i in 0..hd / 2 {
            for j in 0..2 {
                let src = h * hd + 2 * i + j;
                let dst = h * hd + j * hd / 2 + i;
                out[dst * row_len..(dst + 1) * row_len].copy_from_slice(&data[src * row_len..(src + 1) * row_len]);
            }
        }
    }
    Ok(out)
}

/// Loads every weight of `f` into `model` (a config from [`gpt_config_from_gguf`]).
pub fn load_gguf_weights(model: &mut GptModel, f: &GgufFile) -> Result<()> {
    let c = model.config().clone();
    let permuted = f.str("general.architecture")? != "qwen2";
    load_hf_llama(model, &mut |hf| {
        let (name, perm) = gguf_name(hf, &c, permuted)?;
        let (data, shape) = f.read_f32(&name)?;
        let data = match perm {
            Some(heads) => unpermute_rows(&data, heads, if shape.len() == 2 { shape[1] } else { 1 })
                .with_context(|| format!("GGUF tensor `{name}`"))?,
            None => data,
        };
        Ok((data, shape))
    })
}

/// `tokenizer.json` (and `tokenizer_config.json`) of a GGUF `gpt2`-model tokenizer.
pub fn hf_tokenizer_files(f: &GgufFile) -> Result<(Value, Value)> {
    let model = f.str("tokenizer.ggml.model")?;
    if model != "gpt2" {
        bail!("GGUF tokenizer model `{model}` is not supported (byte-level BPE `gpt2` is)");
    }
    let tokens = f.strings("tokenizer.ggml.tokens")?;
    let merges = f.strings("tokenizer.ggml.merges")?;
    let types: Vec<u64> = match f.get("tokenizer.ggml.token_type").and_then(|v| v.as_array()) {
        Some(a) => a.iter().map(|v| v.as_u64().unwrap_or(1)).collect(),
        None => vec![1; tokens.len()],
    };
    let mut vocab = Map::new();
    for (i, t) in tokens.iter().enumerate() {
        vocab.insert(t.to_string(), json!(i));
    }
    // Control (3) and user-defined (4) tokens are matched before the BPE, as transformers does.
    let added: Vec<Value> = tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| matches!(types.get(*i), Some(3) | Some(4)))
        .map(|(i, t)| {
            json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": types[i] == 3})
        })
        .collect();
    let id = |k: &str| f.get(k).and_then(|v| v.as_u64()).map(|v| v as usize);
    let add_bos = f.get("tokenizer.ggml.add_bos_token").and_then(|v| v.as_bool()).unwrap_or(false);
    let bos = id("tokenizer.ggml.bos_token_id");
    let post = match (add_bos, bos) {
        (true, Some(b)) => json!({"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": tokens[b], "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": tokens[b], "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {tokens[b]: {"id": tokens[b], "ids": [b], "tokens": [tokens[b]]}}}),
        _ => Value::Null,
    };
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges},
    });
    let mut config = Map::new();
    for (key, field) in [
        ("bos_token", "tokenizer.ggml.bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id"),
        ("pad_token", "tokenizer.ggml.padding_token_id"),
        ("unk_token", "tokenizer.ggml.unknown_token_id"),
    ] {
        if let Some(t) = id(field).and_then(|i| tokens.get(i)) {
            config.insert(key.into(), json!(t));
        }
    }
    if let Some(t) = f.get("tokenizer.chat_template").and_then(|v| v.as_str()) {
        config.insert("chat_template".into(), json!(t));
    }
    config.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
    Ok((tokenizer, Value::Object(config)))
}

/// The training args a checkpoint of `c` records (the `megatron pretrain` flag names).
pub fn llama_args_json(c: &GptConfig, tokenizer_model: Option<&Path>, from: &str) -> Value {
    json!({
        "model": "gpt",
        "num_layers": c.num_layers,
        "hidden_size": c.hidden_size,
        "ffn_hidden_size": c.ffn_hidden_size,
        "num_attention_heads": c.num_attention_heads,
        "group_query_attention": c.num_query_groups.is_some(),
        "num_query_groups": c.num_query_groups.unwrap_or(1),
        "kv_channels": c.kv_channels,
        "seq_length": c.seq_length,
        "max_position_embeddings": c.max_position_embeddings,
        "make_vocab_size_divisible_by": c.make_vocab_size_divisible_by,
        "normalization": "RMSNorm",
        "norm_epsilon": c.layernorm_epsilon,
        "position_embedding_type": "rope",
        "rotary_base": c.rotary_base,
        "rotary_percent": c.rotary_percent,
        "rotary_interleaved": false,
        "rope_scaling": c.rope_scaling,
        "qk_layernorm": c.qk_layernorm,
        "swiglu": true,
        "disable_bias_linear": true,
        "add_qkv_bias": c.add_qkv_bias,
        "untie_embeddings_and_output_weights": c.untie_embeddings_and_output_weights,
        "init_method_std": c.init_method_std,
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "tokenizer_type": if tokenizer_model.is_some() { json!("HuggingFaceTokenizer") } else { json!("NullTokenizer") },
        "tokenizer_model": tokenizer_model,
        "vocab_size": if tokenizer_model.is_some() { Value::Null } else { json!(c.vocab_size - 1) },
        "mock_data": false,
        "imported_from": from,
    })
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v)?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

pub fn run(args: &ImportGgufArgs, registry: &Registry) -> Result<PathBuf> {
    let f = GgufFile::open(&args.gguf)?;
    let config = gpt_config_from_gguf(&f, args.make_vocab_size_divisible_by, args.seq_length)
        .with_context(|| format!("reading the model config of {}", args.gguf.display()))?;
    let tok_dir = args.save.join("tokenizer");
    std::fs::create_dir_all(&tok_dir).with_context(|| format!("cannot create {}", tok_dir.display()))?;
    let (tokenizer, tok_config) = hf_tokenizer_files(&f)?;
    write_json(&tok_dir.join("tokenizer.json"), &tokenizer)?;
    write_json(&tok_dir.join("tokenizer_config.json"), &tok_config)?;
    let tok_dir = std::fs::canonicalize(&tok_dir)?;

    let backend: Arc<dyn Backend> = registry.backend("cpu", json!({}))?;
    let mut model = GptModel::new(config.clone(), backend.clone(), ParallelContext::single())?;
    load_gguf_weights(&mut model, &f).with_context(|| format!("loading the weights of {}", args.gguf.display()))?;
    let mut meta = CheckpointMeta { args: llama_args_json(&config, Some(&tok_dir), "gguf"), ..Default::default() };
    match registry.tokenizer("HuggingFaceTokenizer", json!({ "tokenizer_model": tok_dir })) {
        Ok(t) => meta.tokenizer_fingerprint = Some(t.fingerprint()),
        Err(e) => println!(
            "WARNING: the tokenizer files were written to {} but cannot be loaded here ({e:#}); \
             build with `--features huggingface` to use them",
            tok_dir.display()
        ),
    }
    let params = model.params();
    let path =
        megatron_checkpoint::save(&args.save, 0, &params, None, meta, backend.as_ref(), &ParallelContext::single())
            .with_context(|| format!("saving the imported checkpoint to {}", args.save.display()))?;
    println!(
        "imported {} ({} layers, hidden {}, {} heads / {} groups, vocab {} padded to {}) into {}",
        args.gguf.display(),
        config.num_layers,
        config.hidden_size,
        config.num_attention_heads,
        config.num_query_groups.unwrap_or(config.num_attention_heads),
        config.vocab_size,
        model.padded_vocab_size(),
        path.display()
    );
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // llama.cpp: reshape(heads, 2, hd/2, c).swapaxes(1, 2); heads 2, hd 4, c 1.
        let hf: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let gguf = vec![0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0];
        assert_eq!(unpermute_rows(&gguf, 2, 1).unwrap(), hf);
        assert!(unpermute_rows(&gguf, 3, 1).is_err());
    }
}
