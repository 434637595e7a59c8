//! transformers' `Mamba2ForCausalLM` ↔ the `mamba` model: the config mapping and the weight
//! name map. transformers' Mamba-2 is exactly an all-`M` pattern with RMSNorm (its in_proj is
//! `[z | xBC | dt]`, its gated norm groups `d_inner / n_groups` channels as here); it has no
//! attention or MLP layers, so hybrid patterns have no transformers counterpart
//! (transformers' `BambaForCausalLM`/`NemotronH` hold hybrids with their own layouts).

use crate::config::HybridConfig;
use crate::model::HybridModel;
use anyhow::{bail, Context, Result};
use megatron_core::{HostBuffer, Model};
use megatron_transformer::NormKind;
use serde_json::Value;

/// Our config for a transformers `Mamba2Config` (`config.json`) and `seq_length`.
pub fn config_from_hf_mamba2(hf: &Value, seq_length: usize) -> Result<HybridConfig> {
    let get = |k: &str| {
        hf.get(k)
            .and_then(Value::as_u64)
            .map(|v| v as usize)
            .with_context(|| format!("config.json: `{k}` missing or not an integer"))
    };
    if hf.get("use_bias").and_then(Value::as_bool) == Some(true) {
        bail!("config.json: use_bias = true (in/out-proj biases) is not supported by the mamba model");
    }
    if hf.get("use_conv_bias").and_then(Value::as_bool) == Some(false) {
        bail!("config.json: use_conv_bias = false is not supported (the mixer always has a conv bias)");
    }
    let layers = get("num_hidden_layers")?;
    let mut c = HybridConfig::new(&"M".repeat(layers), get("hidden_size")?, 1, seq_length, get("vocab_size")?);
    c.mamba_state_dim = get("state_size")?;
    c.mamba_head_dim = get("head_dim")?;
    c.mamba_num_groups = get("n_groups")?;
    c.mamba_num_heads = Some(get("num_heads")?);
    c.mamba_expand = get("expand")?;
    c.mamba_conv_kernel = get("conv_kernel")?;
    c.mamba_chunk_size = get("chunk_size")?;
    c.layernorm_epsilon = hf.get("layer_norm_epsilon").and_then(Value::as_f64).unwrap_or(1e-5) as f32;
    c.normalization = NormKind::RMSNorm;
    c.make_vocab_size_divisible_by = 1; // the embedding has exactly vocab_size rows
    c.untie_embeddings_and_output_weights = hf.get("tie_word_embeddings").and_then(Value::as_bool) == Some(false);
    c.hidden_dropout = 0.0;
    c.attention_dropout = 0.0;
    Ok(c)
}

/// A tensor as `(shape, f32 values)`.
pub type HostTensor = (Vec<usize>, Vec<f32>);

/// The transformers tensor name of our parameter `ours`.
pub fn hf_name(ours: &str) -> Option<String> {
    if ours == "embedding.word_embeddings.weight" {
        return Some("backbone.embeddings.weight".into());
    }
    if ours == "decoder.final_norm.weight" {
        return Some("backbone.norm_f.weight".into());
    }
    if ours == "output_layer.weight" {
        return Some("lm_head.weight".into());
    }
    ours.strip_prefix("decoder.layers.").map(|rest| format!("backbone.layers.{rest}"))
}

/// Fills every parameter of `model` from `get(hf_name)` (shape, f32 values), checking shapes.
pub fn load_hf_mamba2(model: &mut HybridModel, get: &mut dyn FnMut(&str) -> Result<HostTensor>) -> Result<()> {
    model.ensure_whole("importing transformers weights")?;
    let be = model.backend();
    for p in model.params_mut() {
        let name = hf_name(&p.name).with_context(|| format!("no transformers name for parameter `{}`", p.name))?;
        let (shape, data) = get(&name).with_context(|| format!("reading `{name}`"))?;
        if shape != p.layout.global_shape {
            bail!("`{name}` has shape {shape:?}, the model expects {:?} (check config.json)", p.layout.global_shape);
        }
        p.value = be.from_host(HostBuffer::F32(data), &shape)?;
    }
    Ok(())
}

/// `(transformers name, (shape, values))` of every parameter, for `export hf`.
pub fn export_hf_mamba2(model: &HybridModel) -> Result<Vec<(String, HostTensor)>> {
    model.ensure_whole("exporting transformers weights")?;
    let be = model.backend();
    model
        .params()
        .into_iter()
        .map(|p| {
            let name = hf_name(&p.name).with_context(|| format!("no transformers name for `{}`", p.name))?;
            Ok((name, (p.layout.global_shape.clone(), be.to_host(&p.value)?.to_f32_vec())))
        })
        .collect()
}
