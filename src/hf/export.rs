//! `megatron export hf`: a checkpoint (any TP layout: the reader reassembles the shards)
//! becomes a Hugging Face `GPT2LMHeadModel` directory — `config.json`, `model.safetensors`
//! (in `--dtype fp32|bf16|fp16`, by default the dtype the checkpoint was trained in: the
//! stored weights are that dtype's values, so the default loses nothing)
//! (vocabulary padding removed, tied head stored once as HF does), `generation_config.json`,
//! and `vocab.json` + `merges.txt` when the tokenizer is GPT-2 BPE. Written into a temporary
//! directory that is renamed into place, so a crash never leaves a half-written export.

use super::files::{copy_files_out, finish_export, torch_dtype, write_synced};
use crate::generate::loader::{load_model, LoadArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use megatron_core::half::{bf16, f16};
use megatron_core::{DType, Registry};
use megatron_gpt::{export_hf_gpt2, Export, GptModel, HfTensor};
use safetensors::{serialize, Dtype};
use serde_json::json;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Args, Clone, Debug)]
pub struct ExportHfArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// Output directory (must not exist, or be empty).
    #[arg(long)]
    pub out: PathBuf,
    /// dtype of the exported weights: fp32, bf16 or fp16 (default: the training dtype, from
    /// the checkpoint's --bf16/--fp16).
    #[arg(long)]
    pub dtype: Option<String>,
}

/// The export dtype: `--dtype`, else the checkpoint's training dtype.
pub fn export_dtype(flag: Option<&str>, ckpt_args: &serde_json::Value) -> Result<DType> {
    let d = match flag {
        Some(s) => DType::parse(s)?,
        None if ckpt_args["bf16"].as_bool() == Some(true) => DType::BF16,
        None if ckpt_args["fp16"].as_bool() == Some(true) => DType::F16,
        None => DType::F32,
    };
    if !d.is_float() {
        bail!("--dtype {d}: Hugging Face weights are fp32, bf16 or fp16");
    }
    Ok(d)
}

/// Whether `model` is Llama-shaped (RoPE, RMSNorm, SwiGLU, no linear biases): it exports as
/// `LlamaForCausalLM` (`Qwen2ForCausalLM` with a qkv bias), otherwise as GPT-2.
pub fn is_llama(model: &GptModel) -> bool {
    let c = model.config();
    c.uses_rope() && c.swiglu && !c.add_bias_linear && c.normalization == megatron_transformer::NormKind::RMSNorm
}

/// Every HF tensor of `model`: the GPT-2 name map plus `lm_head.weight` when untied, or the
/// Llama name map.
pub fn hf_tensors(model: &GptModel) -> Result<Vec<HfTensor>> {
    if is_llama(model) {
        return megatron_gpt::export_hf_llama(model);
    }
    let mut tensors = export_hf_gpt2(model, Export::Values)?;
    if let Some(head) = &model.output_layer {
        let vocab = model.config().vocab_size;
        let data = model.backend().to_host(&head.value)?.to_f32_vec();
        let h = head.layout.global_shape[1];
        tensors.push(("lm_head.weight".into(), vec![vocab, h], data[..vocab * h].to_vec()));
    }
    Ok(tensors)
}

/// `model.safetensors` bytes (f32, `{"format": "pt"}` metadata as transformers writes).
pub fn safetensors_bytes(tensors: &[HfTensor]) -> Result<Vec<u8>> {
    safetensors_bytes_as(tensors, DType::F32)
}

/// [`safetensors_bytes`] with every tensor rounded (nearest even) to the float dtype `dtype`.
pub fn safetensors_bytes_as(tensors: &[HfTensor], dtype: DType) -> Result<Vec<u8>> {
    let st_dtype = match dtype {
        DType::F32 => Dtype::F32,
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
        other => bail!("cannot export weights as {other}"),
    };
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, d)| {
            let b: Vec<u8> = match dtype {
                DType::BF16 => d.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()).collect(),
                DType::F16 => d.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect(),
                _ => d.iter().flat_map(|v| v.to_le_bytes()).collect(),
            };
            (n.clone(), s.clone(), b)
        })
        .collect();
    let views = bytes
        .iter()
        .map(|(n, s, b)| {
            let v = safetensors::tensor::TensorView::new(st_dtype, s.clone(), b)
                .map_err(|e| anyhow::anyhow!("tensor `{n}`: {e:?}"))?;
            Ok((n.clone(), v))
        })
        .collect::<Result<Vec<_>>>()?;
    let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    serialize(views, &Some(meta)).map_err(|e| anyhow::anyhow!("serialising model.safetensors: {e:?}"))
}

/// The HF `config.json` of a Llama-shaped `model` (Qwen2 when it has a qkv bias, Qwen3 with
/// q/k layernorms).
pub fn hf_llama_config(model: &GptModel, bos: Option<u32>, eos: i32) -> serde_json::Value {
    let c = model.config();
    let tc = c.transformer_config();
    let qwen = c.add_qkv_bias;
    // --qk-layernorm (per-head RMSNorms of q and k) is Qwen3's layout.
    let (arch, ty) = match (c.qk_layernorm, qwen) {
        (true, _) => ("Qwen3ForCausalLM", "qwen3"),
        (false, true) => ("Qwen2ForCausalLM", "qwen2"),
        (false, false) => ("LlamaForCausalLM", "llama"),
    };
    json!({
        "architectures": [arch],
        "model_type": ty,
        "hidden_act": "silu",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.ffn_hidden_size(),
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": tc.query_groups(),
        "head_dim": tc.head_dim(),
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.layernorm_epsilon,
        "rope_theta": c.rotary_base,
        "rope_scaling": megatron_gpt::hf_rope::rope_scaling_to_hf(&c.rope_scaling),
        "partial_rotary_factor": c.rotary_percent,
        "attention_bias": false,
        "mlp_bias": false,
        "initializer_range": c.init_method_std,
        "attention_dropout": 0.0,
        "use_cache": true,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "tie_word_embeddings": !c.untie_embeddings_and_output_weights,
        "torch_dtype": "float32",
    })
}

/// The HF `config.json` of `model` (SPEC §7.7: gelu_new is the tanh GeLU we compute).
pub fn hf_config(model: &GptModel, eod: i32) -> serde_json::Value {
    let c = model.config();
    let ffn = c.ffn_hidden_size();
    json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "activation_function": "gelu_new",
        "vocab_size": c.vocab_size,
        "n_positions": c.max_position_embeddings,
        "n_embd": c.hidden_size,
        "n_layer": c.num_layers,
        "n_head": c.num_attention_heads,
        "n_inner": if ffn == 4 * c.hidden_size { serde_json::Value::Null } else { json!(ffn) },
        "layer_norm_epsilon": c.layernorm_epsilon,
        "initializer_range": c.init_method_std,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "scale_attn_weights": true,
        "use_cache": true,
        "bos_token_id": eod,
        "eos_token_id": eod,
        "tie_word_embeddings": !c.untie_embeddings_and_output_weights,
        "torch_dtype": "float32",
    })
}

pub fn run(args: &ExportHfArgs, registry: &Registry) -> Result<()> {
    #[cfg(feature = "t5")]
    if crate::generate::t5::is_t5_checkpoint(&args.load) {
        return super::t5::export(args, registry);
    }
    let out = &args.out;
    if out.exists() && std::fs::read_dir(out).map(|mut d| d.next().is_some()).unwrap_or(true) {
        bail!("--out {} already exists and is not empty; choose a new directory", out.display());
    }
    #[cfg(feature = "bert")]
    if super::bert::is_bert_checkpoint(&args.load)? {
        return super::bert::export(&args.load, out, registry);
    }
    #[cfg(feature = "hybrid")]
    if crate::generate::hybrid::is_hybrid_checkpoint(&args.load) {
        return super::mamba2::export(args, registry);
    }
    let loaded = load_model(registry, &args.load)?;
    let c = loaded.model.config();
    let llama = is_llama(&loaded.model);
    if !llama && (c.normalization != megatron_transformer::NormKind::LayerNorm || c.swiglu || !c.add_bias_linear) {
        bail!(
            "only GPT-2 shaped models (LayerNorm, GeLU MLP, biases) or Llama shaped ones (RoPE, RMSNorm, \
             SwiGLU, --disable-bias-linear) export to Hugging Face"
        );
    }
    let dtype = export_dtype(args.dtype.as_deref(), &loaded.args)?;
    let bos = loaded.tokenizer.special_ids().bos;
    // An MoE checkpoint (`num_experts` in its args) exports as MixtralForCausalLM.
    let moe = crate::moe_args::plugin_config_from_stored_args(&loaded.args);
    let (tensors, mut config) = match &moe {
        Some(moe) => {
            let config = super::import_mixtral::hf_mixtral_config(&loaded.model, moe, bos, loaded.eod)?;
            let experts = moe["num_experts"].as_u64().unwrap_or(0) as usize;
            let tensors = super::import_mixtral::export_hf_mixtral(&loaded.model, c, experts, c.vocab_size)?;
            (tensors, config)
        }
        None if llama => (hf_tensors(&loaded.model)?, hf_llama_config(&loaded.model, bos, loaded.eod)),
        None => (hf_tensors(&loaded.model)?, hf_config(&loaded.model, loaded.eod)),
    };
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    let name = out.file_name().context("--out needs a directory name")?.to_string_lossy().to_string();
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;

    write_synced(&tmp.join("model.safetensors"), &safetensors_bytes_as(&tensors, dtype)?)?;
    config["torch_dtype"] = json!(torch_dtype(dtype));
    write_synced(&tmp.join("config.json"), serde_json::to_string_pretty(&config)?.as_bytes())?;
    let bos = if llama { json!(bos) } else { json!(loaded.eod) };
    let gen = json!({ "bos_token_id": bos, "eos_token_id": loaded.eod, "_from_model_config": true });
    write_synced(&tmp.join("generation_config.json"), serde_json::to_string_pretty(&gen)?.as_bytes())?;
    if loaded.tokenizer.name() == "GPT2BPETokenizer" {
        let file = |flag: &Option<PathBuf>, key: &str| -> Result<PathBuf> {
            flag.clone()
                .or_else(|| loaded.args[key].as_str().map(PathBuf::from))
                .with_context(|| format!("the checkpoint's args name no {key}; pass --{}", key.replace('_', "-")))
        };
        for (src, dst) in [
            (file(&args.load.vocab_file, "vocab_file")?, "vocab.json"),
            (file(&args.load.merge_file, "merge_file")?, "merges.txt"),
        ] {
            let bytes = std::fs::read(&src).with_context(|| format!("reading tokenizer file {}", src.display()))?;
            write_synced(&tmp.join(dst), &bytes)?;
        }
    }
    if loaded.tokenizer.name() == "HuggingFaceTokenizer" {
        // tokenizer.json and tokenizer_config.json travel with the model.
        let model_path = args
            .load
            .tokenizer_model
            .clone()
            .or_else(|| loaded.args["tokenizer_model"].as_str().map(PathBuf::from))
            .context("the checkpoint's args name no tokenizer_model; pass --tokenizer-model")?;
        let dir = if model_path.is_dir() { model_path } else { model_path.parent().unwrap_or(Path::new(".")).into() };
        copy_files_out(&dir, &["tokenizer.json", "tokenizer_config.json"], &tmp)?;
    }
    finish_export(&tmp, out)?;
    println!(
        "exported iteration {} of {} to {} ({} tensors, vocab {}, {dtype})",
        loaded.iteration,
        args.load.load.display(),
        out.display(),
        tensors.len(),
        c.vocab_size
    );
    Ok(())
}
