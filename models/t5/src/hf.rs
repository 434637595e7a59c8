//! Hugging Face `T5ForConditionalGeneration` weights into [`T5Model`] (tensor parallel size
//! 1): the config mapping (relative positions, RMS `T5LayerNorm`, no biases, ReLU or gated
//! GeLU, unscaled attention, the tied head's `d_model^-0.5` scaling) and the name map:
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
    let scale = cfg["scale_decoder_outputs"].as_bool().or(cfg["tie_word_embeddings"].as_bool()).unwrap_or(true);
    c.output_scale = scale.then(|| (d as f32).powf(-0.5));
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
