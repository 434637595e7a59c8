//! Hugging Face `T5ForConditionalGeneration` weights into [`T5Model`] (tensor parallel size
//! 1): the config mapping (relative positions, RMS `T5LayerNorm`, no biases, ReLU or gated
//! GeLU, unscaled attention, the tied head's `d_model^-0.5` scaling or an untied head) and the
//! name map:
//!
//! | Hugging Face                                              | megatron-rs                                        |
//! |-----------------------------------------------------------|----------------------------------------------------|
//! | `shared.weight`                                           | `embedding.word_embeddings.weight`                 |
//! | `{enc,dec}oder.block.0.layer.0.SelfAttention.relative_attention_bias.weight` | `{enc,dec}oder_relative_pos_emb.relative_attention_bias.weight` |
//! | `….layer.0.SelfAttention.{q,k,v}` (per head q, k, v)      | `….self_attention.linear_qkv.weight`               |
//! | `….layer.0.SelfAttention.o`                               | `….self_attention.linear_proj.weight`              |
//! | `….layer.0.layer_norm`                                    | `….input_layernorm.weight`                         |
//! | decoder `….layer.1.EncDecAttention.q` / `{k,v}` / `o`     | `….cross_attention.linear_q` / `linear_kv` / `linear_proj` |
//! | decoder `….layer.1.layer_norm`                            | `….pre_cross_attn_layernorm.weight`                |
//! | `….layer.{1,2}.DenseReluDense.wi` (`wi_0`, `wi_1`) / `wo` | `….mlp.linear_fc1` (`[wi_0; wi_1]`) / `linear_fc2` |
//! | `….layer.{1,2}.layer_norm`                                | `….pre_mlp_layernorm.weight`                       |
//! | `{enc,dec}oder.final_layer_norm`                          | `{enc,dec}oder.final_layernorm.weight`             |
//! | `lm_head.weight` (untied, T5 v1.1)                        | `lm_head.output_layer.weight`                      |

use crate::config::{T5Activation, T5Config};
use crate::model::T5Model;
use anyhow::{bail, Context, Result};
use megatron_core::{HostBuffer, Model};
use megatron_transformer::NormKind;
use serde_json::Value;

fn field(cfg: &Value, key: &str) -> Result<usize> {
    cfg[key]
        .as_u64()
        .map(|v| v as usize)
        .with_context(|| format!("Hugging Face T5 config.json: missing integer `{key}`"))
}

/// The [`T5Config`] of a Hugging Face T5 `config.json` for sequences of `enc_seq`/`dec_seq`.
pub fn t5_config_from_hf(cfg: &Value, enc_seq: usize, dec_seq: usize) -> Result<T5Config> {
    let d = field(cfg, "d_model")?;
    let mut c = T5Config::new(
        field(cfg, "num_layers")?,
        d,
        field(cfg, "num_heads")?,
        enc_seq,
        dec_seq,
        field(cfg, "vocab_size")?,
    );
    c.decoder_num_layers = cfg["num_decoder_layers"].as_u64().map_or(c.encoder_num_layers, |v| v as usize);
    c.kv_channels = Some(field(cfg, "d_kv")?);
    c.ffn_hidden_size = Some(field(cfg, "d_ff")?);
    c.make_vocab_size_divisible_by = 1;
    c.position_embedding_type = "relative".into();
    c.relative_attention_num_buckets = field(cfg, "relative_attention_num_buckets")?;
    c.relative_attention_max_distance = cfg["relative_attention_max_distance"].as_u64().unwrap_or(128) as usize;
    c.normalization = NormKind::RMSNorm;
    c.layernorm_epsilon = cfg["layer_norm_epsilon"].as_f64().unwrap_or(1e-6) as f32;
    c.activation = match cfg["feed_forward_proj"].as_str().unwrap_or("relu") {
        "relu" => T5Activation::Relu,
        "gated-gelu" => T5Activation::GatedGelu,
        other => bail!("Hugging Face T5 feed_forward_proj `{other}` is not supported (relu, gated-gelu)"),
    };
    c.add_bias_linear = false;
    c.lm_head_bias = false;
    c.softmax_scale = Some(1.0);
    c.hidden_dropout = 0.0;
    c.attention_dropout = 0.0;
    // transformers scales the decoder output before the (always tied) head unless the config
    // says `tie_word_embeddings: false` (T5 v1.1), stored as `scale_decoder_outputs`.
    let tied = cfg["tie_word_embeddings"].as_bool().unwrap_or(true);
    let scale = cfg["scale_decoder_outputs"].as_bool().unwrap_or(tied);
    c.output_scale = scale.then(|| (d as f32).powf(-0.5));
    // T5 v1.1: `lm_head.weight` of its own.
    c.untie_embeddings_and_output_weights = !tied;
    Ok(c)
}

/// `(shape, f32 values)` of a Hugging Face tensor by name.
pub type HfGet<'a> = &'a dyn Fn(&str) -> Result<(Vec<usize>, Vec<f32>)>;

/// Rows of per-head blocks interleaved: head `h` gets `hd` rows of each part in order.
fn interleave_heads(parts: &[Vec<f32>], heads: usize, hd: usize, cols: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(parts.len() * heads * hd * cols);
    for h in 0..heads {
        for p in parts {
            out.extend_from_slice(&p[h * hd * cols..(h + 1) * hd * cols]);
        }
    }
    out
}

/// Copies every parameter of `model` (tp = 1) from the Hugging Face tensors.
pub fn load_hf_t5(model: &mut T5Model, get: HfGet) -> Result<()> {
    let c = model.config().clone();
    let (heads, hd, h) = (c.num_attention_heads, c.head_dim(), c.hidden_size);
    let w = |name: &str| get(name).map(|t| t.1);
    let mut values: Vec<(String, Vec<f32>)> = Vec::new();
    values.push(("embedding.word_embeddings.weight".into(), w("shared.weight")?));
    for stack in ["encoder", "decoder"] {
        let rel = format!("{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
        values.push((format!("{stack}_relative_pos_emb.relative_attention_bias.weight"), w(&rel)?));
        let layers = if stack == "encoder" { c.encoder_num_layers } else { c.decoder_num_layers };
        for i in 0..layers {
            let (hf, ours) = (format!("{stack}.block.{i}.layer"), format!("{stack}.layers.{i}"));
            let sa = format!("{hf}.0.SelfAttention");
            let qkv = [w(&format!("{sa}.q.weight"))?, w(&format!("{sa}.k.weight"))?, w(&format!("{sa}.v.weight"))?];
            values.push((format!("{ours}.input_layernorm.weight"), w(&format!("{hf}.0.layer_norm.weight"))?));
            values.push((format!("{ours}.self_attention.linear_qkv.weight"), interleave_heads(&qkv, heads, hd, h)));
            values.push((format!("{ours}.self_attention.linear_proj.weight"), w(&format!("{sa}.o.weight"))?));
            let ff = if stack == "decoder" {
                let ca = format!("{hf}.1.EncDecAttention");
                let kv = [w(&format!("{ca}.k.weight"))?, w(&format!("{ca}.v.weight"))?];
                values.push((
                    format!("{ours}.pre_cross_attn_layernorm.weight"),
                    w(&format!("{hf}.1.layer_norm.weight"))?,
                ));
                values.push((format!("{ours}.cross_attention.linear_q.weight"), w(&format!("{ca}.q.weight"))?));
                values.push((format!("{ours}.cross_attention.linear_kv.weight"), interleave_heads(&kv, heads, hd, h)));
                values.push((format!("{ours}.cross_attention.linear_proj.weight"), w(&format!("{ca}.o.weight"))?));
                2
            } else {
                1
            };
            let d = format!("{hf}.{ff}.DenseReluDense");
            let fc1 = match c.activation {
                T5Activation::GatedGelu => {
                    let mut g = w(&format!("{d}.wi_0.weight"))?;
                    g.extend(w(&format!("{d}.wi_1.weight"))?);
                    g
                }
                _ => w(&format!("{d}.wi.weight"))?,
            };
            values.push((format!("{ours}.pre_mlp_layernorm.weight"), w(&format!("{hf}.{ff}.layer_norm.weight"))?));
            values.push((format!("{ours}.mlp.linear_fc1.weight"), fc1));
            values.push((format!("{ours}.mlp.linear_fc2.weight"), w(&format!("{d}.wo.weight"))?));
        }
        values.push((format!("{stack}.final_layernorm.weight"), w(&format!("{stack}.final_layer_norm.weight"))?));
    }
    if c.untie_embeddings_and_output_weights {
        values.push(("lm_head.output_layer.weight".into(), w("lm_head.weight")?));
    }
    let be = model.backend();
    let mut params = model.params_mut();
    if params.iter().any(|p| p.layout.tp_size != 1) {
        bail!("Hugging Face T5 import needs --tensor-model-parallel-size 1");
    }
    if params.len() != values.len() {
        bail!("Hugging Face T5 import: the model has {} parameters, the mapping {}", params.len(), values.len());
    }
    for (name, v) in values {
        let p = params
            .iter_mut()
            .find(|p| p.name == name)
            .with_context(|| format!("no parameter `{name}` in the t5 model"))?;
        if p.value.numel() != v.len() {
            bail!("Hugging Face T5 import: `{name}` has {} values, the model expects {:?}", v.len(), p.value.shape());
        }
        let shape = p.value.shape().to_vec();
        p.value = be.from_host(HostBuffer::F32(v), &shape)?;
    }
    Ok(())
}

/// `parts` per-head interleaved blocks back into separate tensors (inverse of [`interleave_heads`]).
fn split_heads(x: &[f32], parts: usize, heads: usize, hd: usize, cols: usize) -> Vec<Vec<f32>> {
    let mut out = vec![Vec::with_capacity(heads * hd * cols); parts];
    for (i, block) in x.chunks_exact(hd * cols).enumerate() {
        out[i % parts].extend_from_slice(block);
    }
    out
}

/// A Hugging Face tensor: name, shape, f32 values.
pub type HfTensor = (String, Vec<usize>, Vec<f32>);

/// The Hugging Face T5 tensors of `model` (tp = 1; the inverse of [`load_hf_t5`]; the vocab
/// padding rows, if any, are cut). `shared.weight` stands for the tied
/// `encoder.embed_tokens` / `decoder.embed_tokens` / `lm_head` too.
pub fn export_hf_t5(model: &T5Model) -> Result<Vec<HfTensor>> {
    let c = model.config().clone();
    let (heads, hd, h) = (c.num_attention_heads, c.head_dim(), c.hidden_size);
    if c.position_embedding_type != "relative" || c.add_bias_linear || c.lm_head_bias {
        bail!("Hugging Face T5 export needs relative positions, no linear biases and no LM head bias");
    }
    let be = model.backend();
    let params = model.params();
    let get = |name: &str| -> Result<(Vec<usize>, Vec<f32>)> {
        let p = params.iter().find(|p| p.name == name).with_context(|| format!("no parameter `{name}`"))?;
        if p.layout.tp_size != 1 {
            bail!("Hugging Face T5 export needs --tensor-model-parallel-size 1");
        }
        Ok((p.value.shape().to_vec(), be.to_host(&p.value)?.to_f32_vec()))
    };
    let mut out: Vec<HfTensor> = Vec::new();
    let (_, mut emb) = get("embedding.word_embeddings.weight")?;
    emb.truncate(c.vocab_size * h);
    out.push(("shared.weight".into(), vec![c.vocab_size, h], emb));
    let inner = heads * hd;
    for stack in ["encoder", "decoder"] {
        let (s, v) = get(&format!("{stack}_relative_pos_emb.relative_attention_bias.weight"))?;
        out.push((format!("{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"), s, v));
        let layers = if stack == "encoder" { c.encoder_num_layers } else { c.decoder_num_layers };
        for i in 0..layers {
            let (hf, ours) = (format!("{stack}.block.{i}.layer"), format!("{stack}.layers.{i}"));
            let copy = |out: &mut Vec<HfTensor>, from: &str, to: String| -> Result<()> {
                let (s, v) = get(&format!("{ours}.{from}"))?;
                out.push((to, s, v));
                Ok(())
            };
            let sa = format!("{hf}.0.SelfAttention");
            let qkv = split_heads(&get(&format!("{ours}.self_attention.linear_qkv.weight"))?.1, 3, heads, hd, h);
            for (p, v) in ["q", "k", "v"].iter().zip(qkv) {
                out.push((format!("{sa}.{p}.weight"), vec![inner, h], v));
            }
            copy(&mut out, "self_attention.linear_proj.weight", format!("{sa}.o.weight"))?;
            copy(&mut out, "input_layernorm.weight", format!("{hf}.0.layer_norm.weight"))?;
            let ff = if stack == "decoder" {
                let ca = format!("{hf}.1.EncDecAttention");
                copy(&mut out, "cross_attention.linear_q.weight", format!("{ca}.q.weight"))?;
                let kv = split_heads(&get(&format!("{ours}.cross_attention.linear_kv.weight"))?.1, 2, heads, hd, h);
                for (p, v) in ["k", "v"].iter().zip(kv) {
                    out.push((format!("{ca}.{p}.weight"), vec![inner, h], v));
                }
                copy(&mut out, "cross_attention.linear_proj.weight", format!("{ca}.o.weight"))?;
                copy(&mut out, "pre_cross_attn_layernorm.weight", format!("{hf}.1.layer_norm.weight"))?;
                2
            } else {
                1
            };
            let d = format!("{hf}.{ff}.DenseReluDense");
            let (s, fc1) = get(&format!("{ours}.mlp.linear_fc1.weight"))?;
            match c.activation {
                T5Activation::GatedGelu => {
                    let half = fc1.len() / 2;
                    out.push((format!("{d}.wi_0.weight"), vec![s[0] / 2, h], fc1[..half].to_vec()));
                    out.push((format!("{d}.wi_1.weight"), vec![s[0] / 2, h], fc1[half..].to_vec()));
                }
                _ => out.push((format!("{d}.wi.weight"), s, fc1)),
            }
            copy(&mut out, "mlp.linear_fc2.weight", format!("{d}.wo.weight"))?;
            copy(&mut out, "pre_mlp_layernorm.weight", format!("{hf}.{ff}.layer_norm.weight"))?;
        }
        let (s, v) = get(&format!("{stack}.final_layernorm.weight"))?;
        out.push((format!("{stack}.final_layer_norm.weight"), s, v));
    }
    if c.untie_embeddings_and_output_weights {
        let (_, mut head) = get("lm_head.output_layer.weight")?;
        head.truncate(c.vocab_size * h);
        out.push(("lm_head.weight".into(), vec![c.vocab_size, h], head));
    }
    Ok(out)
}
