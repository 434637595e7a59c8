//! The name and global shape of every parameter a single-stage [`GptModel`] of a config holds,
//! computed without building it. Loaders compare this list with the tensors a checkpoint
//! actually stores *before* allocating a model, so metadata that claims a huge model (a
//! corrupted or hostile `metadata.json`) is an error instead of an allocation abort, and the
//! memory estimate of a run can count parameters without allocating them.
//!
//! [`GptModel`]: crate::GptModel

use crate::config::GptConfig;
use crate::model::WORD_EMBEDDING;
use megatron_transformer::NormKind;

/// `(name, global shape)` of every parameter of the whole model (all pipeline stages; the
/// tied head is the word embedding, stored once), in the model's parameter order. Sizes
/// saturate instead of overflowing, so absurd configs give absurd shapes, never a panic.
/// Callers bound `config.num_layers` first: the list has about 12 entries per layer.
pub fn gpt_param_shapes(config: &GptConfig, padded_vocab: usize) -> Vec<(String, Vec<usize>)> {
    let h = config.hidden_size;
    let f = config.ffn_hidden_size.unwrap_or(h.saturating_mul(4));
    let gates = if config.swiglu { 2 } else { 1 };
    let bias = config.add_bias_linear;
    let mut out: Vec<(String, Vec<usize>)> = vec![(WORD_EMBEDDING.to_string(), vec![padded_vocab, h])];
    // RoPE models have no learned position table (the model builds none).
    if !config.uses_rope() {
        out.push(("embedding.position_embeddings.weight".to_string(), vec![config.max_position_embeddings, h]));
    }
    let norm = |out: &mut Vec<(String, Vec<usize>)>, prefix: &str| {
        out.push((format!("{prefix}.weight"), vec![h]));
        if config.normalization == NormKind::LayerNorm {
            out.push((format!("{prefix}.bias"), vec![h]));
        }
    };
    let linear = |out: &mut Vec<(String, Vec<usize>)>, prefix: &str, rows: usize, cols: usize| {
        out.push((format!("{prefix}.weight"), vec![rows, cols]));
        if bias {
            out.push((format!("{prefix}.bias"), vec![rows]));
        }
    };
    for i in 0..config.num_layers {
        let p = format!("decoder.layers.{i}");
        norm(&mut out, &format!("{p}.input_layernorm"));
        // GQA: `np` query heads and `ng` key/value groups of `kv_channels` each.
        let np = config.num_attention_heads.max(1);
        let kv = config.kv_channels.unwrap_or(h / np);
        let ng = config.num_query_groups.unwrap_or(np);
        let qkv = kv.saturating_mul(np + 2 * ng);
        out.push((format!("{p}.self_attention.linear_qkv.weight"), vec![qkv, h]));
        if bias || config.add_qkv_bias {
            out.push((format!("{p}.self_attention.linear_qkv.bias"), vec![qkv]));
        }
        linear(&mut out, &format!("{p}.self_attention.linear_proj"), h, kv.saturating_mul(np));
        if config.qk_layernorm {
            for which in ["q_layernorm", "k_layernorm"] {
                out.push((format!("{p}.self_attention.{which}.weight"), vec![kv]));
                if config.normalization == NormKind::LayerNorm {
                    out.push((format!("{p}.self_attention.{which}.bias"), vec![kv]));
                }
            }
        }
        norm(&mut out, &format!("{p}.pre_mlp_layernorm"));
        linear(&mut out, &format!("{p}.mlp.linear_fc1"), f.saturating_mul(gates), h);
        linear(&mut out, &format!("{p}.mlp.linear_fc2"), h, f);
    }
    norm(&mut out, "decoder.final_layernorm");
    if config.untie_embeddings_and_output_weights {
        out.push(("output_layer.weight".to_string(), vec![padded_vocab, h]));
    }
    out
}

/// Number of parameter elements of the whole model (saturating).
pub fn gpt_param_count(config: &GptConfig, padded_vocab: usize) -> usize {
    let h = config.hidden_size;
    let f = config.ffn_hidden_size.unwrap_or(h.saturating_mul(4));
    let gates = if config.swiglu { 2 } else { 1 };
    let norm = if config.normalization == NormKind::LayerNorm { 2 * h } else { h };
    let b = usize::from(config.add_bias_linear);
    let mul = |a: usize, c: usize| a.saturating_mul(c);
    let (np, ng) = (config.num_attention_heads, config.num_query_groups.unwrap_or(config.num_attention_heads));
    let hn = config.kv_channels.unwrap_or(h / np.max(1));
    let qkv_rows = mul(np.saturating_add(mul(ng, 2)), hn);
    let per_layer = [
        mul(norm, 2),
        mul(qkv_rows, h),
        mul(qkv_rows, b),
        mul(h, mul(np, hn)),
        mul(h, b),
        mul(mul(f, gates), h),
        mul(mul(f, gates), b),
        mul(h, f),
        mul(h, b),
        // --qk-layernorm: two norms over head_dim (weight, and bias for LayerNorm).
        mul(
            usize::from(config.qk_layernorm),
            mul(2 * hn, if config.normalization == NormKind::LayerNorm { 2 } else { 1 }),
        ),
    ]
    .iter()
    .fold(0usize, |a, &x| a.saturating_add(x));
    let heads = if config.untie_embeddings_and_output_weights { 2 } else { 1 };
    mul(mul(padded_vocab, h), heads)
        .saturating_add(mul(config.max_position_embeddings, h))
        .saturating_add(mul(per_layer, config.num_layers))
        .saturating_add(norm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GptModel;
    use megatron_core::{Model, ParallelContext};

    /// The computed list equals what a built model holds, for every architecture switch.
    #[test]
    fn shapes_match_a_built_model() {
        let backend: std::sync::Arc<dyn megatron_core::Backend> = std::sync::Arc::new(megatron_cpu::CpuBackend::new());
        for variant in 0..8 {
            let mut c = GptConfig::new(3, 16, 4, 8, 50);
            c.ffn_hidden_size = Some(24);
            match variant {
                1 => c.swiglu = true,
                2 => c.normalization = NormKind::RMSNorm,
                3 => c.add_bias_linear = false,
                4 => {
                    c.untie_embeddings_and_output_weights = true;
                    c.max_position_embeddings = 12;
                }
                5 => c.num_query_groups = Some(2),
                6 => c.qk_layernorm = true,
                7 => {
                    c.qk_layernorm = true;
                    c.normalization = NormKind::RMSNorm;
                    c.num_query_groups = Some(2);
                }
                _ => {}
            }
            let model = GptModel::new(c.clone(), backend.clone(), ParallelContext::single()).unwrap();
            let built: Vec<(String, Vec<usize>)> =
                model.params().iter().map(|p| (p.name.clone(), p.layout.global_shape.clone())).collect();
            let padded = model.padded_vocab_size();
            assert_eq!(gpt_param_shapes(&c, padded), built, "variant {variant}");
            let count: usize = built.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
            assert_eq!(gpt_param_count(&c, padded), count, "variant {variant}");
        }
    }

    #[test]
    fn absurd_sizes_saturate_instead_of_panicking() {
        let c = GptConfig::new(1, usize::MAX / 2, 1, 1, 1);
        assert_eq!(gpt_param_count(&c, usize::MAX), usize::MAX);
        assert!(gpt_param_shapes(&c, 1).iter().any(|(_, s)| s.contains(&usize::MAX)));
    }
}
