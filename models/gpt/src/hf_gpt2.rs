//! Hugging Face `GPT2LMHeadModel` ⇄ our GPT parameters (SPEC §7.7).
//!
//! HF's Conv1D stores `[in, out]` (we store `[out, in]`: transpose). HF's `c_attn` output
//! columns are `[q | k | v]` blocks of `h`, heads contiguous inside each block; our fused
//! `linear_qkv` rows are per head `[np, 3, hn]`. HF's `wte` fills the first `vocab` rows of our
//! padded word embedding; the padding rows are zeroed (they are never targets).

use crate::model::GptModel;
use anyhow::{bail, Context, Result};
use megatron_core::{DType, HostBuffer, Param};
use megatron_transformer::init::take_shard;
use megatron_transformer::{NormKind, Split};
use safetensors::{Dtype, SafeTensors};
use std::path::Path;

/// How one HF tensor becomes one of ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HfTransform {
    AsIs,
    /// Conv1D `[in, out]` → `[out, in]`.
    Transpose,
    /// `c_attn.weight [h, 3h]` (`[q|k|v]` columns) → `linear_qkv.weight [np*3*hn, h]`.
    QkvWeight,
    /// `c_attn.bias [3h]` → `linear_qkv.bias` in `[np, 3, hn]` order.
    QkvBias,
    /// `wte [vocab, h]` → the first `vocab` rows of `[V_padded, h]`.
    WordEmbedding,
}

/// One row of the name map: our name, HF's name and the transform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HfEntry {
    pub ours: String,
    pub hf: String,
    pub transform: HfTransform,
}

/// The name map of a tied GPT-2 with `num_layers` layers.
pub fn hf_gpt2_entries(num_layers: usize) -> Vec<HfEntry> {
    use HfTransform::*;
    let e = |ours: String, hf: String, transform| HfEntry { ours, hf, transform };
    let mut v = vec![
        e("embedding.word_embeddings.weight".into(), "transformer.wte.weight".into(), WordEmbedding),
        e("embedding.position_embeddings.weight".into(), "transformer.wpe.weight".into(), AsIs),
    ];
    for i in 0..num_layers {
        let (o, h) = (format!("decoder.layers.{i}"), format!("transformer.h.{i}"));
        let rows = [
            ("input_layernorm.weight", "ln_1.weight", AsIs),
            ("input_layernorm.bias", "ln_1.bias", AsIs),
            ("self_attention.linear_qkv.weight", "attn.c_attn.weight", QkvWeight),
            ("self_attention.linear_qkv.bias", "attn.c_attn.bias", QkvBias),
            ("self_attention.linear_proj.weight", "attn.c_proj.weight", Transpose),
            ("self_attention.linear_proj.bias", "attn.c_proj.bias", AsIs),
            ("pre_mlp_layernorm.weight", "ln_2.weight", AsIs),
            ("pre_mlp_layernorm.bias", "ln_2.bias", AsIs),
            ("mlp.linear_fc1.weight", "mlp.c_fc.weight", Transpose),
            ("mlp.linear_fc1.bias", "mlp.c_fc.bias", AsIs),
            ("mlp.linear_fc2.weight", "mlp.c_proj.weight", Transpose),
            ("mlp.linear_fc2.bias", "mlp.c_proj.bias", AsIs),
        ];
        v.extend(rows.into_iter().map(|(a, b, t)| e(format!("{o}.{a}"), format!("{h}.{b}"), t)));
    }
    v.push(e("decoder.final_layernorm.weight".into(), "transformer.ln_f.weight".into(), AsIs));
    v.push(e("decoder.final_layernorm.bias".into(), "transformer.ln_f.bias".into(), AsIs));
    v
}

/// `(ours_row, hf_col)` pairs of the fused-QKV permutation for `h = np * hn`.
fn qkv_permutation(np: usize, hn: usize) -> impl Iterator<Item = (usize, usize)> {
    let h = np * hn;
    (0..np).flat_map(move |head| {
        (0..3).flat_map(move |which| (0..hn).map(move |d| (head * 3 * hn + which * hn + d, which * h + head * hn + d)))
    })
}

fn transpose(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; data.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = data[r * cols + c];
        }
    }
    out
}

/// HF tensor (`hf_shape`) → our global tensor of `global_shape`.
pub fn hf_to_ours(t: HfTransform, hf: &[f32], hf_shape: &[usize], global_shape: &[usize], heads: usize) -> Vec<f32> {
    match t {
        HfTransform::AsIs => hf.to_vec(),
        HfTransform::Transpose => transpose(hf, hf_shape[0], hf_shape[1]),
        HfTransform::QkvWeight => {
            let h = global_shape[1];
            let mut out = vec![0.0; hf.len()];
            for (row, col) in qkv_permutation(heads, h / heads) {
                for i in 0..h {
                    out[row * h + i] = hf[i * 3 * h + col];
                }
            }
            out
        }
        HfTransform::QkvBias => {
            let mut out = vec![0.0; hf.len()];
            for (row, col) in qkv_permutation(heads, global_shape[0] / 3 / heads) {
                out[row] = hf[col];
            }
            out
        }
        HfTransform::WordEmbedding => {
            let mut out = vec![0.0; global_shape.iter().product()];
            out[..hf.len()].copy_from_slice(hf);
            out
        }
    }
}

/// Our global tensor → HF layout (inverse of [`hf_to_ours`]); `hf_rows` is the HF vocab for
/// the word embedding. Returns the data and the HF shape.
pub fn ours_to_hf(
    t: HfTransform,
    ours: &[f32],
    global_shape: &[usize],
    heads: usize,
    hf_rows: usize,
) -> (Vec<f32>, Vec<usize>) {
    match t {
        HfTransform::AsIs => (ours.to_vec(), global_shape.to_vec()),
        HfTransform::Transpose => {
            (transpose(ours, global_shape[0], global_shape[1]), vec![global_shape[1], global_shape[0]])
        }
        HfTransform::QkvWeight => {
            let h = global_shape[1];
            let mut out = vec![0.0; ours.len()];
            for (row, col) in qkv_permutation(heads, h / heads) {
                for i in 0..h {
                    out[i * 3 * h + col] = ours[row * h + i];
                }
            }
            (out, vec![h, 3 * h])
        }
        HfTransform::QkvBias => {
            let mut out = vec![0.0; ours.len()];
            for (row, col) in qkv_permutation(heads, global_shape[0] / 3 / heads) {
                out[col] = ours[row];
            }
            (out, global_shape.to_vec())
        }
        HfTransform::WordEmbedding => {
            let h = global_shape[1];
            (ours[..hf_rows * h].to_vec(), vec![hf_rows, h])
        }
    }
}

/// Reads a float safetensors tensor as f32.
fn read_f32(tensors: &SafeTensors, name: &str) -> Result<(Vec<f32>, Vec<usize>)> {
    let view = tensors.tensor(name).with_context(|| format!("the HF checkpoint has no tensor `{name}`"))?;
    let dtype = match view.dtype() {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        other => bail!("HF tensor `{name}` has dtype {other:?}; expected F32, F16 or BF16"),
    };
    let data = HostBuffer::from_le_bytes(dtype, view.data()).with_context(|| format!("HF tensor `{name}`"))?;
    Ok((data.to_f32_vec(), view.shape().to_vec()))
}

fn split_of(p: &Param) -> Split {
    match p.layout.tp_axis {
        None => Split::Replicated,
        Some(0) => Split::Rows { chunks: 1 },
        Some(_) => Split::Cols,
    }
}

fn check_gpt2_compatible(model: &GptModel) -> Result<()> {
    let c = model.config();
    if c.normalization != NormKind::LayerNorm
        || c.swiglu
        || !c.add_bias_linear
        || c.uses_rope()
        || c.num_query_groups.is_some_and(|g| g != c.num_attention_heads)
        || c.kv_channels.is_some_and(|k| k * c.num_attention_heads != c.hidden_size)
    {
        bail!(
            "HF GPT-2 needs normalization LayerNorm, swiglu false, add_bias_linear true, learned positions \
             and plain multi-head attention (a Llama-style model exports as HF Llama)"
        );
    }
    Ok(())
}

/// Loads HF GPT-2 weights into `model` (any TP rank: each rank keeps its shard). Shapes must
/// match the model's config; an untied model takes `lm_head.weight` when present, else `wte`.
pub fn load_hf_gpt2(model: &mut GptModel, tensors: &SafeTensors) -> Result<()> {
    check_gpt2_compatible(model)?;
    let heads = model.config().num_attention_heads;
    let mut entries = hf_gpt2_entries(model.config().num_layers);
    if model.output_layer.is_some() {
        let has_head = tensors.names().iter().any(|n| n.as_str() == "lm_head.weight");
        let hf = if has_head { "lm_head.weight" } else { "transformer.wte.weight" };
        entries.push(HfEntry {
            ours: "output_layer.weight".into(),
            hf: hf.into(),
            transform: HfTransform::WordEmbedding,
        });
    }
    let backend = model.backend();
    for e in entries {
        let (hf, hf_shape) = read_f32(tensors, &e.hf)?;
        let param = model.param_mut(&e.ours).with_context(|| format!("model has no parameter `{}`", e.ours))?;
        let global = param.layout.global_shape.clone();
        let expected: Vec<usize> = match e.transform {
            HfTransform::Transpose | HfTransform::QkvWeight => vec![global[1], global[0]],
            HfTransform::WordEmbedding => vec![hf_shape[0].min(global[0]), global[1]],
            _ => global.clone(),
        };
        if hf_shape != expected || (e.transform == HfTransform::WordEmbedding && hf_shape[0] > global[0]) {
            bail!(
                "HF tensor `{}` has shape {hf_shape:?} but `{}` (global {global:?}) needs {expected:?}; \
                 the gpt config does not match the checkpoint's config.json",
                e.hf,
                e.ours
            );
        }
        let ours = hf_to_ours(e.transform, &hf, &hf_shape, &global, heads);
        let shard = take_shard(&ours, &global, split_of(param), param.layout.tp_rank, param.layout.tp_size)?;
        let shape = param.value.shape().to_vec();
        param.value = backend.from_host(HostBuffer::F32(shard), &shape)?;
    }
    Ok(())
}

/// [`load_hf_gpt2`] from a `model.safetensors` file.
pub fn load_hf_gpt2_file(model: &mut GptModel, path: &Path) -> Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("reading HF checkpoint {}", path.display()))?;
    let tensors = SafeTensors::deserialize(&bytes)
        .map_err(|e| anyhow::anyhow!("{} is not a valid safetensors file: {e}", path.display()))?;
    load_hf_gpt2(model, &tensors).with_context(|| format!("loading {}", path.display()))
}

/// An exported tensor: HF name, HF shape, row-major data.
pub type HfTensor = (String, Vec<usize>, Vec<f32>);

/// Which tensor of every parameter to export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Export {
    Values,
    Grads,
}

/// Our parameters (or gradients) in HF GPT-2 names and layouts: `(name, shape, data)`.
/// Needs the whole tensors, so tp = 1 only (gather shards first otherwise).
pub fn export_hf_gpt2(model: &GptModel, which: Export) -> Result<Vec<HfTensor>> {
    check_gpt2_compatible(model)?;
    let c = model.config();
    let backend = model.backend();
    let mut out = Vec::new();
    for e in hf_gpt2_entries(c.num_layers) {
        let p = model.param(&e.ours).with_context(|| format!("model has no parameter `{}`", e.ours))?;
        if p.layout.tp_size != 1 && p.layout.tp_axis.is_some() {
            bail!("export_hf_gpt2 needs tensor-parallel size 1 (parameter `{}` is sharded)", e.ours);
        }
        let t = if which == Export::Values { &p.value } else { &p.grad };
        let data = backend.to_host(t)?.to_f32_vec();
        let (hf, shape) = ours_to_hf(e.transform, &data, &p.layout.global_shape, c.num_attention_heads, c.vocab_size);
        out.push((e.hf, shape, hf));
    }
    Ok(out)
}
