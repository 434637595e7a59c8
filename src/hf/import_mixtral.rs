//! Hugging Face `MixtralForCausalLM` ⇄ a GPT whose MLP slots the `moe` plugin fills (SPEC
//! §4.12, §7.7). The attention, norms, embedding and head follow the Llama map
//! (`megatron_gpt::hf_llama`); every layer's `block_sparse_moe` maps to the plugin's names:
//!
//! | ours (`decoder.layers.{i}.mlp.`) | Mixtral (`model.layers.{i}.block_sparse_moe.`) |
//! |---|---|
//! | `router.weight [E, h]` | `gate.weight` |
//! | `experts.local_experts.{j}.linear_fc1.weight [2F, h]` | `experts.{j}.w1.weight` (gate) ; `w3` (up) stacked |
//! | `experts.local_experts.{j}.linear_fc2.weight [h, F]` | `experts.{j}.w2.weight` |
//!
//! Mixtral's router (softmax over all experts, top-k, renormalised over the k) equals the
//! plugin's default softmax-after-top-k, so no conversion of the scores is needed.

use anyhow::{bail, Context, Result};
use megatron_checkpoint::CheckpointMeta;
use megatron_core::registry::ModelEnv;
use megatron_core::{Backend, Model, ParallelContext, Param, Registry};
use megatron_gpt::hf_llama::{fuse_qkv, hf_llama_entries, split_qkv, Dense, LlamaEntry};
use megatron_gpt::GptConfig;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One exported tensor: `(HF name, shape, f32 data)`.
pub type HfMixtralTensor = (String, Vec<usize>, Vec<f32>);

/// Whether an HF `config.json` describes a Mixtral model.
pub fn is_mixtral(cfg: &Value) -> bool {
    cfg["model_type"].as_str() == Some("mixtral")
}

/// The GPT config and the `moe` plugin config of a Mixtral `config.json`.
pub fn mixtral_configs(cfg: &Value, path: &Path, divisible_by: usize) -> Result<(GptConfig, Value)> {
    if !is_mixtral(cfg) {
        bail!("{}: model_type {} is not `mixtral`", path.display(), cfg["model_type"]);
    }
    if cfg["sliding_window"].as_u64().is_some() {
        bail!("{}: sliding_window attention is not supported (set it to null)", path.display());
    }
    let mut llama = cfg.clone();
    // transformers 5 writes `rope_parameters.rope_theta`; older versions `rope_theta`.
    if llama["rope_theta"].is_null() {
        llama["rope_theta"] = cfg["rope_parameters"]["rope_theta"].clone();
    }
    let gpt = crate::hf::import_llama::gpt_config_from_hf_llama(&llama, path, divisible_by)?;
    let field =
        |k: &str| cfg[k].as_u64().map(|v| v as usize).with_context(|| format!("{}: no integer `{k}`", path.display()));
    let moe = json!({
        "num_experts": field("num_local_experts")?,
        "moe_router_topk": field("num_experts_per_tok")?,
        "moe_ffn_hidden_size": field("intermediate_size")?,
    });
    Ok((gpt, moe))
}

/// The Mixtral names of one MoE layer's parameters: `(ours, [hf names stacked by rows])`.
fn moe_entries(layer: usize, experts: usize) -> Vec<(String, Vec<String>)> {
    let (o, h) = (format!("decoder.layers.{layer}.mlp"), format!("model.layers.{layer}.block_sparse_moe"));
    let mut v = vec![(format!("{o}.router.weight"), vec![format!("{h}.gate.weight")])];
    for j in 0..experts {
        let (oe, he) = (format!("{o}.experts.local_experts.{j}"), format!("{h}.experts.{j}"));
        v.push((format!("{oe}.linear_fc1.weight"), vec![format!("{he}.w1.weight"), format!("{he}.w3.weight")]));
        v.push((format!("{oe}.linear_fc2.weight"), vec![format!("{he}.w2.weight")]));
    }
    v
}

/// Loads Mixtral tensors (`get(name)` → f32 data and shape) into `model` (one rank, tp = 1).
pub fn load_hf_mixtral(
    model: &mut dyn Model,
    config: &GptConfig,
    num_experts: usize,
    get: &mut dyn FnMut(&str) -> Result<Dense>,
) -> Result<()> {
    let tc = config.transformer_config();
    let (np, ng, hn) = (config.num_attention_heads, tc.query_groups(), tc.head_dim());
    let rows = config.padded_vocab_size(1)?;
    let mut params: HashMap<String, &mut Param> = model.params_mut().into_iter().map(|p| (p.name.clone(), p)).collect();
    let mut set = |ours: &str, data: Vec<f32>| -> Result<()> {
        let p = params.get_mut(ours).with_context(|| format!("the model has no parameter `{ours}`"))?;
        if p.layout.tp_size != 1 {
            bail!("Mixtral import loads one rank (tp = 1); `{ours}` is tensor-parallel");
        }
        if data.len() != p.value.numel() {
            bail!("`{ours}`: {} values from Hugging Face for shape {:?}", data.len(), p.value.shape());
        }
        p.value.host_f32_mut()?.copy_from_slice(&data);
        Ok(())
    };
    for (ours, entry) in hf_llama_entries(config.num_layers, config.untie_embeddings_and_output_weights, false) {
        if ours.contains(".mlp.") {
            continue;
        }
        let data = match entry {
            LlamaEntry::One { hf, pad_rows } => {
                let (mut d, shape) = get(&hf)?;
                if pad_rows {
                    d.resize(rows * shape.get(1).copied().unwrap_or(0), 0.0);
                }
                d
            }
            LlamaEntry::Qkv { q, k, v } => fuse_qkv(&get(&q)?.0, &get(&k)?.0, &get(&v)?.0, np, ng, hn),
            LlamaEntry::GateUp { .. } => bail!("`{ours}`: a dense MLP entry in a Mixtral model"),
        };
        set(&ours, data)?;
    }
    for layer in 0..config.num_layers {
        for (ours, hf) in moe_entries(layer, num_experts) {
            let mut data = Vec::new();
            for name in &hf {
                data.extend(get(name)?.0);
            }
            set(&ours, data)?;
        }
    }
    Ok(())
}

/// `model`'s weights in Mixtral names and layouts: `(name, shape, data)`, vocabulary padding
/// rows dropped (`vocab` rows kept).
pub fn export_hf_mixtral(
    model: &dyn Model,
    config: &GptConfig,
    num_experts: usize,
    vocab: usize,
) -> Result<Vec<HfMixtralTensor>> {
    let tc = config.transformer_config();
    let (np, ng, hn, h) = (config.num_attention_heads, tc.query_groups(), tc.head_dim(), config.hidden_size);
    let params: HashMap<&str, &Param> = model.params().into_iter().map(|p| (p.name.as_str(), p)).collect();
    let get = |ours: &str| -> Result<Vec<f32>> {
        let p = params.get(ours).with_context(|| format!("the model has no parameter `{ours}`"))?;
        Ok(p.value.host_f32()?.to_vec())
    };
    let mut out = Vec::new();
    for (ours, entry) in hf_llama_entries(config.num_layers, config.untie_embeddings_and_output_weights, false) {
        if ours.contains(".mlp.") {
            continue;
        }
        let shape = params.get(ours.as_str()).map(|p| p.value.shape().to_vec()).unwrap_or_default();
        match entry {
            LlamaEntry::One { hf, pad_rows: true } => {
                out.push((hf, vec![vocab, h], get(&ours)?[..vocab * h].to_vec()));
            }
            LlamaEntry::One { hf, .. } => out.push((hf, shape, get(&ours)?)),
            LlamaEntry::Qkv { q, k, v } => {
                let (qd, kd, vd) = split_qkv(&get(&ours)?, np, ng, hn);
                out.push((q, vec![np * hn, h], qd));
                out.push((k, vec![ng * hn, h], kd));
                out.push((v, vec![ng * hn, h], vd));
            }
            LlamaEntry::GateUp { .. } => bail!("`{ours}`: a dense MLP entry in a Mixtral model"),
        }
    }
    for layer in 0..config.num_layers {
        for (ours, hf) in moe_entries(layer, num_experts) {
            let (d, shape) = {
                let p = params.get(ours.as_str()).with_context(|| format!("the model has no parameter `{ours}`"))?;
                (p.value.host_f32()?.to_vec(), p.value.shape().to_vec())
            };
            let rows = shape[0] / hf.len();
            for (i, name) in hf.into_iter().enumerate() {
                out.push((name, vec![rows, shape[1]], d[i * rows * shape[1]..(i + 1) * rows * shape[1]].to_vec()));
            }
        }
    }
    Ok(out)
}

/// The Hugging Face `config.json` of a Mixtral-shaped `model` with the `moe` plugin config
/// `moe` (from the checkpoint's args): the Llama config plus the experts. Refuses what
/// `MixtralForCausalLM` cannot express (dense layers, shared experts, sigmoid scores, scaled
/// gates, capacity dropping).
pub fn hf_mixtral_config(model: &megatron_gpt::GptModel, moe: &Value, bos: Option<u32>, eos: i32) -> Result<Value> {
    let c = model.config();
    let unsupported: [(&str, bool); 7] = [
        (
            "--moe-layer-freq other than 1 (dense layers)",
            !matches!(moe.get("moe_layer_freq"), None | Some(Value::Null)) && moe["moe_layer_freq"] != json!(1),
        ),
        ("--moe-shared-expert-intermediate-size", !moe["moe_shared_expert_intermediate_size"].is_null()),
        (
            "--moe-router-score-function sigmoid",
            moe["moe_router_score_function"].as_str().is_some_and(|f| f != "softmax"),
        ),
        ("--moe-router-topk-scaling-factor", !moe["moe_router_topk_scaling_factor"].is_null()),
        ("--moe-expert-capacity-factor", !moe["moe_expert_capacity_factor"].is_null()),
        ("--moe-router-enable-expert-bias", moe["moe_router_enable_expert_bias"].as_bool() == Some(true)),
        ("--moe-router-num-groups (group-limited routing)", !moe["moe_router_num_groups"].is_null()),
    ];
    if let Some((what, _)) = unsupported.iter().find(|(_, bad)| *bad) {
        bail!(
            "this MoE checkpoint uses {what}, which Mixtral (MixtralForCausalLM) cannot express; it cannot be exported"
        );
    }
    if !crate::hf::export::is_llama(model) {
        bail!("Mixtral export needs a Llama-shaped model (RoPE, RMSNorm, SwiGLU, --disable-bias-linear)");
    }
    let field = |k: &str| moe[k].as_u64().with_context(|| format!("the checkpoint's MoE args have no integer `{k}`"));
    let mut cfg = crate::hf::export::hf_llama_config(model, bos, eos);
    cfg["architectures"] = json!(["MixtralForCausalLM"]);
    cfg["model_type"] = json!("mixtral");
    cfg["num_local_experts"] = json!(field("num_experts")?);
    cfg["num_experts_per_tok"] = json!(field("moe_router_topk")?);
    cfg["intermediate_size"] = json!(moe["moe_ffn_hidden_size"].as_u64().unwrap_or(c.ffn_hidden_size() as u64));
    cfg["router_aux_loss_coef"] = json!(moe["moe_aux_loss_coeff"].as_f64().unwrap_or(0.0));
    // f32 values as the shortest decimal that reads back to them (1e-5, not 9.99999974e-6).
    let short = |v: f32| v.to_string().parse::<f64>().unwrap_or(v as f64);
    cfg["rms_norm_eps"] = json!(short(c.layernorm_epsilon));
    cfg["output_router_logits"] = json!(false);
    cfg["sliding_window"] = Value::Null;
    for k in ["mlp_bias", "head_dim", "partial_rotary_factor"] {
        if let Some(o) = cfg.as_object_mut() {
            o.remove(k);
        }
    }
    Ok(cfg)
}

/// `megatron import hf` for a Mixtral directory (`model.safetensors` or the shards of
/// `model.safetensors.index.json`): builds the GPT
/// with the registry's `moe` plugin (`--plugin libmegatron_moe.so` or feature `moe`), loads the
/// weights and saves iteration 0 with the MoE flags in its args.
pub fn run(
    dir: &Path,
    cfg: &Value,
    cfg_path: &Path,
    save: &Path,
    divisible_by: usize,
    registry: &Registry,
) -> Result<PathBuf> {
    let (config, moe) = mixtral_configs(cfg, cfg_path, divisible_by)?;
    let experts = moe["num_experts"].as_u64().unwrap_or(0) as usize;
    let backend: Arc<dyn Backend> = registry.backend("cpu", json!({}))?;
    let env = ModelEnv {
        backend: backend.clone(),
        ctx: ParallelContext::single(),
        mlp: Some(registry.mlp_provider("moe", moe.clone())?),
    };
    let mut model = registry.model("gpt", serde_json::to_value(&config)?, &env)?;
    super::files::with_safetensors_dir(dir, |read| load_hf_mixtral(model.as_mut(), &config, experts, read))
        .with_context(|| format!("loading {}", dir.display()))?;
    let mut args = crate::hf::gguf::llama_args_json(&config, None, "hf");
    for (k, v) in moe.as_object().into_iter().flatten() {
        args[k] = v.clone();
    }
    let meta = CheckpointMeta { args, ..Default::default() };
    let params = model.params();
    let out = megatron_checkpoint::save(save, 0, &params, None, meta, backend.as_ref(), &ParallelContext::single())
        .with_context(|| format!("saving the imported checkpoint to {}", save.display()))?;
    println!(
        "imported {} (mixtral, {} layers, {experts} experts) into {}",
        dir.display(),
        config.num_layers,
        out.display()
    );
    Ok(out)
}
