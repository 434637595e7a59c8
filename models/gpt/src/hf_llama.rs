//! Hugging Face `LlamaForCausalLM` / `MistralForCausalLM` / `Qwen2ForCausalLM` ⇄ our GPT
//! parameters (SPEC §7.7). The three share one tensor layout; Qwen2 adds q/k/v biases, Qwen3
//! (`Qwen3ForCausalLM`) per-head q/k RMSNorms (our `--qk-layernorm`).
//!
//! HF keeps separate `q_proj [np·hn, h]`, `k_proj`/`v_proj [ng·hn, h]`; our fused
//! `linear_qkv` rows are Megatron's `[ng, np/ng + 2, hn]` (per group its query heads, then its
//! key and value). HF's `gate_proj`/`up_proj [F, h]` become the two halves `[gate; up]` of
//! `linear_fc1`. HF Linear weights are `[out, in]` like ours (no transpose). HF's rotary
//! convention (rotate the two halves of each head) is our non-interleaved rotary, so q/k need
//! no permutation here (GGUF files store them interleaved: see the GGUF importer).

use crate::model::GptModel;
use anyhow::{bail, Context, Result};
use megatron_core::HostBuffer;
use megatron_transformer::init::take_shard;
use megatron_transformer::{NormKind, Split};

/// A row-major tensor: data and shape.
pub type Dense = (Vec<f32>, Vec<usize>);

/// The HF names of one of our parameters and how they combine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LlamaEntry {
    /// One HF tensor, same layout (`pad_rows`: the word embedding/head, padded vocab rows).
    One { hf: String, pad_rows: bool },
    /// `q, k, v` (weights or biases) fused into `[ng, r+2, hn]` rows.
    Qkv { q: String, k: String, v: String },
    /// `gate, up` stacked into `linear_fc1`.
    GateUp { gate: String, up: String },
}

/// `(our name, entry)` for every parameter of a Llama-style GPT.
pub fn hf_llama_entries(num_layers: usize, untied: bool, qkv_bias: bool) -> Vec<(String, LlamaEntry)> {
    hf_llama_entries_with(num_layers, untied, qkv_bias, false)
}

/// [`hf_llama_entries`], with Qwen3's per-head `q_norm`/`k_norm` (our `--qk-layernorm`
/// RMSNorms `q_layernorm`/`k_layernorm`) when `qk_norm`.
pub fn hf_llama_entries_with(
    num_layers: usize,
    untied: bool,
    qkv_bias: bool,
    qk_norm: bool,
) -> Vec<(String, LlamaEntry)> {
    let one = |hf: String| LlamaEntry::One { hf, pad_rows: false };
    let mut v = vec![(
        "embedding.word_embeddings.weight".to_string(),
        LlamaEntry::One { hf: "model.embed_tokens.weight".into(), pad_rows: true },
    )];
    for i in 0..num_layers {
        let (o, h) = (format!("decoder.layers.{i}"), format!("model.layers.{i}"));
        v.push((format!("{o}.input_layernorm.weight"), one(format!("{h}.input_layernorm.weight"))));
        let qkv = |kind: &str| LlamaEntry::Qkv {
            q: format!("{h}.self_attn.q_proj.{kind}"),
            k: format!("{h}.self_attn.k_proj.{kind}"),
            v: format!("{h}.self_attn.v_proj.{kind}"),
        };
        v.push((format!("{o}.self_attention.linear_qkv.weight"), qkv("weight")));
        if qkv_bias {
            v.push((format!("{o}.self_attention.linear_qkv.bias"), qkv("bias")));
        }
        v.push((format!("{o}.self_attention.linear_proj.weight"), one(format!("{h}.self_attn.o_proj.weight"))));
        if qk_norm {
            v.push((format!("{o}.self_attention.q_layernorm.weight"), one(format!("{h}.self_attn.q_norm.weight"))));
            v.push((format!("{o}.self_attention.k_layernorm.weight"), one(format!("{h}.self_attn.k_norm.weight"))));
        }
        v.push((format!("{o}.pre_mlp_layernorm.weight"), one(format!("{h}.post_attention_layernorm.weight"))));
        v.push((
            format!("{o}.mlp.linear_fc1.weight"),
            LlamaEntry::GateUp { gate: format!("{h}.mlp.gate_proj.weight"), up: format!("{h}.mlp.up_proj.weight") },
        ));
        v.push((format!("{o}.mlp.linear_fc2.weight"), one(format!("{h}.mlp.down_proj.weight"))));
    }
    v.push(("decoder.final_layernorm.weight".into(), one("model.norm.weight".into())));
    if untied {
        v.push(("output_layer.weight".into(), LlamaEntry::One { hf: "lm_head.weight".into(), pad_rows: true }));
    }
    v
}

/// Fuses HF `q [np·hn, c]`, `k`, `v [ng·hn, c]` (c = h for weights, 1 for biases) into our
/// `[ng, r+2, hn] × c` rows.
pub fn fuse_qkv(q: &[f32], k: &[f32], v: &[f32], np: usize, ng: usize, hn: usize) -> Vec<f32> {
    let c = k.len() / (ng * hn);
    let r = np / ng;
    let mut out = Vec::with_capacity(q.len() + k.len() + v.len());
    for g in 0..ng {
        out.extend_from_slice(&q[g * r * hn * c..(g + 1) * r * hn * c]);
        out.extend_from_slice(&k[g * hn * c..(g + 1) * hn * c]);
        out.extend_from_slice(&v[g * hn * c..(g + 1) * hn * c]);
    }
    out
}

/// The inverse of [`fuse_qkv`]: `(q, k, v)`.
pub fn split_qkv(fused: &[f32], np: usize, ng: usize, hn: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let r = np / ng;
    let c = fused.len() / ((np + 2 * ng) * hn);
    let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
    for grp in fused.chunks_exact((r + 2) * hn * c) {
        q.extend_from_slice(&grp[..r * hn * c]);
        k.extend_from_slice(&grp[r * hn * c..(r + 1) * hn * c]);
        v.extend_from_slice(&grp[(r + 1) * hn * c..]);
    }
    (q, k, v)
}

fn check_llama_compatible(model: &GptModel) -> Result<()> {
    let c = model.config();
    if c.normalization != NormKind::RMSNorm || !c.swiglu || c.add_bias_linear || !c.uses_rope() || c.rotary_interleaved
    {
        bail!(
            "HF Llama/Mistral/Qwen2 need --normalization RMSNorm --swiglu --disable-bias-linear \
             --position-embedding-type rope (not interleaved)"
        );
    }
    if c.qk_layernorm && c.add_qkv_bias {
        bail!("--qk-layernorm with --add-qkv-bias has no HF layout (Qwen3 has q/k norms, Qwen2 the qkv bias)");
    }
    Ok(())
}

fn split_of(p: &megatron_core::Param) -> Split {
    match p.layout.tp_axis {
        None => Split::Replicated,
        Some(0) => Split::Rows { chunks: if p.name.ends_with("linear_fc1.weight") { 2 } else { 1 } },
        Some(_) => Split::Cols,
    }
}

/// Loads HF Llama-family tensors into `model` (each TP rank keeps its shard). `get(name)`
/// returns an HF tensor as f32 (from safetensors, a GGUF file, ...).
pub fn load_hf_llama(model: &mut GptModel, get: &mut dyn FnMut(&str) -> Result<Dense>) -> Result<()> {
    check_llama_compatible(model)?;
    let c = model.config().clone();
    let tc = c.transformer_config();
    let (np, ng, hn, h) = (c.num_attention_heads, tc.query_groups(), tc.head_dim(), c.hidden_size);
    let f = c.ffn_hidden_size();
    let untied = c.untie_embeddings_and_output_weights;
    let backend = model.backend();
    for (ours, entry) in hf_llama_entries_with(c.num_layers, untied, c.add_qkv_bias, c.qk_layernorm) {
        let mut fetch = |name: &str, want: Vec<usize>| -> Result<Vec<f32>> {
            let (d, shape) = get(name)?;
            if shape != want {
                bail!("HF tensor `{name}` has shape {shape:?}, the model config needs {want:?}");
            }
            Ok(d)
        };
        let param = model.param_mut(&ours).with_context(|| format!("model has no parameter `{ours}`"))?;
        let global = param.layout.global_shape.clone();
        let bias = ours.ends_with(".bias");
        let cols = |rows: usize| if bias { vec![rows] } else { vec![rows, h] };
        let data = match &entry {
            LlamaEntry::One { hf, pad_rows: true } => {
                let (d, shape) = get(hf)?;
                if shape.len() != 2 || shape[1] != global[1] || shape[0] > global[0] {
                    bail!("HF tensor `{hf}` has shape {shape:?}; `{ours}` is {global:?} (padded vocabulary)");
                }
                let mut out = vec![0.0; global.iter().product()];
                out[..d.len()].copy_from_slice(&d);
                out
            }
            LlamaEntry::One { hf, .. } => fetch(hf, global.clone())?,
            LlamaEntry::Qkv { q, k, v } => {
                let (q, k, v) = (fetch(q, cols(np * hn))?, fetch(k, cols(ng * hn))?, fetch(v, cols(ng * hn))?);
                fuse_qkv(&q, &k, &v, np, ng, hn)
            }
            LlamaEntry::GateUp { gate, up } => {
                let mut g = fetch(gate, vec![f, h])?;
                g.extend(fetch(up, vec![f, h])?);
                g
            }
        };
        if data.len() != global.iter().product::<usize>() {
            bail!("`{ours}`: {} values for global shape {global:?}", data.len());
        }
        let shard = take_shard(&data, &global, split_of(param), param.layout.tp_rank, param.layout.tp_size)?;
        let shape = param.value.shape().to_vec();
        param.value = backend.from_host(HostBuffer::F32(shard), &shape)?;
    }
    Ok(())
}

/// Our parameters in HF Llama names and layouts (tp = 1), each `(name, shape, data)`; the
/// vocabulary padding rows are dropped (`vocab` rows kept).
pub fn export_hf_llama(model: &GptModel) -> Result<Vec<crate::HfTensor>> {
    check_llama_compatible(model)?;
    let c = model.config();
    let tc = c.transformer_config();
    let (np, ng, hn, h) = (c.num_attention_heads, tc.query_groups(), tc.head_dim(), c.hidden_size);
    let backend = model.backend();
    let mut out = Vec::new();
    let untied = c.untie_embeddings_and_output_weights;
    for (ours, entry) in hf_llama_entries_with(c.num_layers, untied, c.add_qkv_bias, c.qk_layernorm) {
        let p = model.param(&ours).with_context(|| format!("model has no parameter `{ours}`"))?;
        if p.layout.tp_size != 1 && p.layout.tp_axis.is_some() {
            bail!("export to HF Llama needs tensor-parallel size 1 (parameter `{ours}` is sharded)");
        }
        let data = backend.to_host(&p.value)?.to_f32_vec();
        let shape = p.layout.global_shape.clone();
        let rows = |n: usize| if shape.len() == 1 { vec![n] } else { vec![n, h] };
        match entry {
            LlamaEntry::One { hf, pad_rows: true } => {
                out.push((hf, vec![c.vocab_size, h], data[..c.vocab_size * h].to_vec()));
            }
            LlamaEntry::One { hf, .. } => out.push((hf, shape, data)),
            LlamaEntry::Qkv { q, k, v } => {
                let (qd, kd, vd) = split_qkv(&data, np, ng, hn);
                out.push((q, rows(np * hn), qd));
                out.push((k, rows(ng * hn), kd));
                out.push((v, rows(ng * hn), vd));
            }
            LlamaEntry::GateUp { gate, up } => {
                let half = data.len() / 2;
                out.push((gate, vec![shape[0] / 2, h], data[..half].to_vec()));
                out.push((up, vec![shape[0] / 2, h], data[half..].to_vec()));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qkv_fusion_groups_queries_with_their_kv_and_inverts() {
        // np = 4, ng = 2, hn = 1, c = 2: q rows 0..4, k rows 10, 11, v rows 20, 21.
        let q: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let k = vec![10.0, 10.5, 11.0, 11.5];
        let v = vec![20.0, 20.5, 21.0, 21.5];
        let f = fuse_qkv(&q, &k, &v, 4, 2, 1);
        assert_eq!(f, vec![0., 1., 2., 3., 10., 10.5, 20., 20.5, 4., 5., 6., 7., 11., 11.5, 21., 21.5]);
        assert_eq!(split_qkv(&f, 4, 2, 1), (q, k, v));
    }
}
