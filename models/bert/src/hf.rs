//! Hugging Face BERT (`BertModel`, `BertForPreTraining`) weights into a [`BertModel`]: the
//! post-LN layout with the embedding LayerNorm, HF's separate q/k/v fused into Megatron's
//! per-head `[np, 3, hn]` `linear_qkv` rows, the word embedding (and MLM bias) zero-padded to
//! the padded vocabulary. `hidden_act = "gelu"` selects the exact erf GeLU. Without `cls.*`
//! tensors (a plain `BertModel`) the LM head is initialised fresh; its pooler (if any) is
//! kept in our binary head, whose 2-way linear then starts fresh (so finetuning heads on the
//! pooled `[CLS]` start from the pretrained pooler). [`HfImport::fresh`] lists every parameter
//! that did not come from the checkpoint. tp = 1. [`export_hf_bert`] is the way back
//! (`BertForPreTraining` / `BertForMaskedLM`).

use crate::config::{BertConfig, LayerNormPlacement};
use crate::model::BertModel;
use anyhow::{bail, Context, Result};
use megatron_core::{Backend, HostBuffer, ParallelContext};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

pub struct HfImport {
    pub model: BertModel,
    /// Our parameters initialised fresh (not in the checkpoint).
    pub fresh: Vec<String>,
    /// Checkpoint tensors not used (e.g. the pooler of a `BertModel` without the binary head).
    pub unused: Vec<String>,
}

/// The [`BertConfig`] of an HF `config.json`.
pub fn config_from_hf(cfg: &Value, has_heads: bool) -> Result<BertConfig> {
    let get = |k: &str| cfg[k].as_u64().with_context(|| format!("config.json: missing integer `{k}`"));
    let act = cfg["hidden_act"].as_str().unwrap_or("gelu");
    let gelu_erf = match act {
        "gelu" => true,
        "gelu_new" | "gelu_pytorch_tanh" => false,
        other => bail!("config.json: hidden_act `{other}` is not supported (gelu, gelu_new, gelu_pytorch_tanh)"),
    };
    Ok(BertConfig {
        num_layers: get("num_hidden_layers")? as usize,
        hidden_size: get("hidden_size")? as usize,
        num_attention_heads: get("num_attention_heads")? as usize,
        ffn_hidden_size: Some(get("intermediate_size")? as usize),
        max_position_embeddings: get("max_position_embeddings")? as usize,
        vocab_size: get("vocab_size")? as usize,
        num_tokentypes: cfg["type_vocab_size"].as_u64().unwrap_or(2) as usize,
        bert_binary_head: has_heads,
        layernorm: LayerNormPlacement::Post,
        gelu_erf,
        layernorm_epsilon: cfg["layer_norm_eps"].as_f64().unwrap_or(1e-12) as f32,
        hidden_dropout: cfg["hidden_dropout_prob"].as_f64().unwrap_or(0.1) as f32,
        attention_dropout: cfg["attention_probs_dropout_prob"].as_f64().unwrap_or(0.1) as f32,
        ..Default::default()
    })
}

fn f32_tensor(st: &SafeTensors, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
    let t = st.tensor(name).with_context(|| format!("tensor `{name}`"))?;
    if t.dtype() != Dtype::F32 {
        bail!("tensor `{name}` is {:?}; only F32 checkpoints are supported", t.dtype());
    }
    let v = t.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    Ok((t.shape().to_vec(), v))
}

/// Our parameter name → its Hugging Face tensor names (three for the fused qkv: q, k, v).
/// `pre` is `"bert."` for the `BertFor*` classes, `""` for a bare `BertModel`; `pooler`,
/// `binary` and `heads` add the pooler, `cls.seq_relationship` (binary head) and
/// `cls.predictions` (LM head).
pub fn name_map(
    config: &BertConfig,
    pre: &str,
    pooler: bool,
    binary: bool,
    heads: bool,
) -> BTreeMap<String, Vec<String>> {
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut add = |ours: String, theirs: &[String]| {
        map.insert(ours, theirs.to_vec());
    };
    let e = format!("{pre}embeddings");
    add("embedding.word_embeddings.weight".into(), &[format!("{e}.word_embeddings.weight")]);
    add("embedding.position_embeddings.weight".into(), &[format!("{e}.position_embeddings.weight")]);
    add("embedding.tokentype_embeddings.weight".into(), &[format!("{e}.token_type_embeddings.weight")]);
    for p in ["weight", "bias"] {
        add(format!("embedding.layernorm.{p}"), &[format!("{e}.LayerNorm.{p}")]);
        for l in 0..config.num_layers {
            let (o, t) = (format!("encoder.layers.{l}"), format!("{pre}encoder.layer.{l}"));
            let qkv: Vec<String> =
                ["query", "key", "value"].iter().map(|x| format!("{t}.attention.self.{x}.{p}")).collect();
            add(format!("{o}.self_attention.linear_qkv.{p}"), &qkv);
            add(format!("{o}.self_attention.linear_proj.{p}"), &[format!("{t}.attention.output.dense.{p}")]);
            add(format!("{o}.post_attention_layernorm.{p}"), &[format!("{t}.attention.output.LayerNorm.{p}")]);
            add(format!("{o}.mlp.linear_fc1.{p}"), &[format!("{t}.intermediate.dense.{p}")]);
            add(format!("{o}.mlp.linear_fc2.{p}"), &[format!("{t}.output.dense.{p}")]);
            add(format!("{o}.post_mlp_layernorm.{p}"), &[format!("{t}.output.LayerNorm.{p}")]);
        }
        if pooler {
            add(format!("pooler.dense.{p}"), &[format!("{pre}pooler.dense.{p}")]);
        }
        if binary {
            add(format!("binary_head.{p}"), &[format!("cls.seq_relationship.{p}")]);
        }
        if heads {
            add(format!("lm_head.dense.{p}"), &[format!("cls.predictions.transform.dense.{p}")]);
            add(format!("lm_head.layer_norm.{p}"), &[format!("cls.predictions.transform.LayerNorm.{p}")]);
        }
    }
    if heads {
        add("output_layer.bias".into(), &["cls.predictions.bias".to_string()]);
    }
    map
}

/// Loads `dir/config.json` and `dir/model.safetensors` (vocabulary padded to a multiple of 128).
pub fn load_hf_bert(dir: &Path, backend: Arc<dyn Backend>) -> Result<HfImport> {
    load_hf_bert_padded(dir, backend, 128)
}

/// [`load_hf_bert`] with the vocabulary padded to a multiple of `divisible_by`
/// (`--make-vocab-size-divisible-by`).
pub fn load_hf_bert_padded(dir: &Path, backend: Arc<dyn Backend>, divisible_by: usize) -> Result<HfImport> {
    if divisible_by == 0 {
        bail!("--make-vocab-size-divisible-by must be >= 1 (Megatron's default is 128)");
    }
    let cfg_path = dir.join("config.json");
    let cfg: Value = serde_json::from_str(
        &std::fs::read_to_string(&cfg_path).with_context(|| format!("reading {}", cfg_path.display()))?,
    )
    .with_context(|| format!("parsing {}", cfg_path.display()))?;
    let st_path = dir.join("model.safetensors");
    let bytes = std::fs::read(&st_path).with_context(|| format!("reading {}", st_path.display()))?;
    let st = SafeTensors::deserialize(&bytes).with_context(|| format!("parsing {}", st_path.display()))?;
    let names: Vec<String> = st.names().into_iter().cloned().collect();
    let pre = if names.iter().any(|n| n.starts_with("bert.")) { "bert." } else { "" };
    let has_heads = names.iter().any(|n| n == "cls.seq_relationship.weight");
    let has_lm = names.iter().any(|n| n == "cls.predictions.bias");
    // The pooler lives in our binary head: a checkpoint with a pooler (a `BertModel` with
    // `add_pooling_layer`) keeps it, and the sentence-order linear starts fresh if absent.
    let has_pooler = names.iter().any(|n| *n == format!("{pre}pooler.dense.weight"));
    let config =
        BertConfig { make_vocab_size_divisible_by: divisible_by, ..config_from_hf(&cfg, has_heads || has_pooler)? };
    let (h, np) = (config.hidden_size, config.num_attention_heads);
    let hn = h / np;
    let map = name_map(&config, pre, has_pooler, has_heads, has_lm);
    let mut model = BertModel::new(config, backend.clone(), ParallelContext::single())?;
    let mut used: Vec<String> = Vec::new();
    let mut fresh = Vec::new();
    for p in model.params_mut() {
        let Some(theirs) = map.get(&p.name) else {
            fresh.push(p.name.clone());
            continue;
        };
        let want = p.value.shape().to_vec();
        let data: Vec<f32> = if theirs.len() == 3 {
            // q, k, v ([h, h] or [h]) → per head [q_h; k_h; v_h].
            let parts = theirs.iter().map(|n| f32_tensor(&st, n)).collect::<Result<Vec<_>>>()?;
            let row = parts[0].1.len() / h; // h for weights, 1 for biases
            let mut v = Vec::with_capacity(3 * parts[0].1.len());
            for head in 0..np {
                for (_, t) in &parts {
                    v.extend_from_slice(&t[head * hn * row..(head + 1) * hn * row]);
                }
            }
            v
        } else {
            let (shape, mut v) = f32_tensor(&st, &theirs[0])?;
            // The vocabulary is padded: extra rows (or bias entries) are zero.
            if shape.first() != want.first() && (p.name.starts_with("embedding.word") || p.name == "output_layer.bias")
            {
                v.resize(want.iter().product(), 0.0);
            }
            v
        };
        if data.len() != p.value.numel() {
            bail!("`{}` ← {:?}: {} values for shape {:?}", p.name, theirs, data.len(), want);
        }
        p.value = backend.from_host(HostBuffer::F32(data), &want)?;
        used.extend(theirs.iter().cloned());
    }
    let unused = names.into_iter().filter(|n| !used.contains(n) && !n.ends_with("position_ids")).collect();
    Ok(HfImport { model, fresh, unused })
}

/// One Hugging Face tensor: name, shape, f32 values.
pub type HfTensor = (String, Vec<usize>, Vec<f32>);

/// Every tensor of a tp = 1 post-LN `model` as Hugging Face stores it: `BertForPreTraining`
/// with the binary head, else `BertForMaskedLM` (no pooler); the per-head fused qkv split back
/// into query/key/value, the vocabulary padding cut off, the tied decoder stored once (as
/// transformers saves it). A model without token types gets a zero `[1, h]` token-type table
/// (`type_vocab_size = 1`: adding it changes nothing).
pub fn export_hf_bert(model: &BertModel) -> Result<Vec<HfTensor>> {
    let c = model.config();
    if c.layernorm != LayerNormPlacement::Post {
        bail!(
            "Hugging Face BERT is post-LN; this model is pre-LN (Megatron-Core's layout) and has no HF equivalent \
             (train with --bert-post-ln to export)"
        );
    }
    if model.ctx().tp_size() != 1 {
        bail!("export_hf_bert takes a tp = 1 model (load the checkpoint at tp = 1)");
    }
    let binary = model.binary_head.is_some();
    let map = name_map(c, "bert.", binary, binary, true);
    let (h, np, v) = (c.hidden_size, c.num_attention_heads, c.vocab_size);
    let hn = h / np;
    let bk = model.backend();
    let mut out: Vec<HfTensor> = Vec::new();
    for p in model.params() {
        let theirs = map.get(&p.name).with_context(|| format!("parameter `{}` has no Hugging Face name", p.name))?;
        let data = bk.to_host(&p.value)?.to_f32_vec();
        let shape = p.layout.global_shape.clone();
        if theirs.len() == 3 {
            // Per head [q_h; k_h; v_h] rows → three [h, (h)] tensors.
            let row = data.len() / (3 * h);
            let mut parts: Vec<Vec<f32>> = (0..3).map(|_| Vec::with_capacity(h * row)).collect();
            for head in 0..np {
                for (j, part) in parts.iter_mut().enumerate() {
                    let at = (head * 3 + j) * hn * row;
                    part.extend_from_slice(&data[at..at + hn * row]);
                }
            }
            let shape = if row == 1 { vec![h] } else { vec![h, row] };
            for (name, part) in theirs.iter().zip(parts) {
                out.push((name.clone(), shape.clone(), part));
            }
            continue;
        }
        let (shape, data) = match p.name.as_str() {
            "embedding.word_embeddings.weight" => (vec![v, h], data[..v * h].to_vec()),
            "output_layer.bias" => (vec![v], data[..v].to_vec()),
            _ => (shape, data),
        };
        out.push((theirs[0].clone(), shape, data));
    }
    if model.tokentype_embeddings.is_none() {
        out.push(("bert.embeddings.token_type_embeddings.weight".into(), vec![1, h], vec![0.0; h]));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The `config.json` of [`export_hf_bert`]'s tensors.
pub fn hf_bert_config(model: &BertModel) -> Value {
    let c = model.config();
    let binary = model.binary_head.is_some();
    serde_json::json!({
        "architectures": [if binary { "BertForPreTraining" } else { "BertForMaskedLM" }],
        "model_type": "bert",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_attention_heads,
        "intermediate_size": c.ffn(),
        "hidden_act": if c.gelu_erf { "gelu" } else { "gelu_new" },
        "max_position_embeddings": c.max_position_embeddings,
        "type_vocab_size": c.num_tokentypes.max(1),
        "layer_norm_eps": c.layernorm_epsilon,
        "hidden_dropout_prob": c.hidden_dropout,
        "attention_probs_dropout_prob": c.attention_dropout,
        "initializer_range": c.init_method_std,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
    })
}
