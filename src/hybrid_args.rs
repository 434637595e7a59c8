//! `megatron pretrain --model hybrid|mamba`: Megatron's Mamba/hybrid flags (SPEC §4.11,
//! §4.15.1) and the model plugin config built from them. `--hybrid-layer-pattern` gives one
//! symbol per layer (`M` Mamba-2, `*` attention, `-` MLP) and must have `--num-layers`
//! symbols; `--model mamba` without a pattern is `--num-layers` Mamba layers.

use crate::args::PretrainArgs;
use clap::Args;
use serde::Serialize;
use serde_json::{json, Value};

#[derive(Args, Clone, Debug, Default, Serialize)]
pub struct HybridArgs {
    /// Hybrid models: one symbol per layer, `M` Mamba-2, `*` attention, `-` MLP; `|` between
    /// pipeline stages (one segment per stage; without it the layers are split evenly).
    #[arg(long)]
    pub hybrid_layer_pattern: Option<String>,
    /// Mamba-2 state size N.
    #[arg(long, default_value_t = 128)]
    pub mamba_state_dim: usize,
    /// Mamba-2 head size P.
    #[arg(long, default_value_t = 64)]
    pub mamba_head_dim: usize,
    /// Mamba-2 groups of B and C.
    #[arg(long, default_value_t = 8)]
    pub mamba_num_groups: usize,
    /// Mamba-2 heads H (default `2 * hidden / head_dim`).
    #[arg(long)]
    pub mamba_num_heads: Option<usize>,
    /// Deprecated Megatron name of `--hybrid-layer-pattern`.
    #[arg(long)]
    pub hybrid_override_pattern: Option<String>,
    /// Fraction of attention layers for the automatic pattern (Megatron's allocation).
    #[arg(long, default_value_t = 0.0)]
    pub hybrid_attention_ratio: f64,
    /// Fraction of MLP layers for the automatic pattern.
    #[arg(long, default_value_t = 0.0)]
    pub hybrid_mlp_ratio: f64,
    /// Steps per chunk of the SSD scan (megatron-rs; Megatron's kernel uses 128).
    #[arg(long, default_value_t = 128)]
    pub mamba_chunk_size: usize,
}

/// The layer pattern of `--model NAME`, or why there is none: `--hybrid-layer-pattern` (or the
/// deprecated `--hybrid-override-pattern`), else Megatron's allocation from the ratios (all `M`
/// when both are 0). With both, the symbol counts must agree (SPEC §4.11).
pub fn pattern(a: &PretrainArgs) -> Result<String, String> {
    let h = &a.hybrid;
    let given = h.hybrid_layer_pattern.as_ref().or(h.hybrid_override_pattern.as_ref());
    let ratios = h.hybrid_attention_ratio > 0.0 || h.hybrid_mlp_ratio > 0.0;
    #[cfg(feature = "hybrid")]
    let auto = || {
        megatron_hybrid::config::allocate_pattern(a.num_layers, h.hybrid_attention_ratio, h.hybrid_mlp_ratio)
            .map_err(|e| e.to_string())
    };
    #[cfg(not(feature = "hybrid"))]
    let auto = || -> Result<String, String> {
        Err("the hybrid layer allocation needs the `hybrid` feature: rebuild with `--features hybrid`".into())
    };
    // `|` marks pipeline-stage boundaries; it is not a layer.
    let layers = |p: &str| p.chars().filter(|c| *c != '|').count();
    match given {
        Some(p) if layers(p) != a.num_layers => Err(format!(
            "--hybrid-layer-pattern `{p}` has {} layer symbols but --num-layers is {}; give one symbol per layer",
            layers(p),
            a.num_layers
        )),
        Some(p) if ratios => {
            let auto = auto()?;
            let count = |s: &str, c: char| s.chars().filter(|x| *x == c).count();
            if ['*', '-'].iter().any(|&c| count(p, c) != count(&auto, c)) {
                return Err(format!(
                    "--hybrid-layer-pattern `{p}` does not have the attention/MLP counts of the ratios \
                     (`{auto}`); drop the ratios or fix the pattern"
                ));
            }
            Ok(p.clone())
        }
        Some(p) => Ok(p.clone()),
        None if ratios || a.model == "mamba" => auto(),
        None => Err("--model hybrid needs --hybrid-layer-pattern (e.g. `M-M*-`) or --hybrid-attention-ratio".into()),
    }
}

/// The `hybrid`/`mamba` model plugin config (the plugin validates the sizes).
pub fn model_config(a: &PretrainArgs, vocab_size: usize) -> Value {
    let h = &a.hybrid;
    let mut c = json!({
        "hybrid_layer_pattern": pattern(a).unwrap_or_default(),
        "hidden_size": a.hidden_size,
        "num_attention_heads": a.num_attention_heads,
        "ffn_hidden_size": a.ffn_hidden_size,
        "seq_length": a.seq_length,
        "vocab_size": vocab_size,
        "make_vocab_size_divisible_by": a.make_vocab_size_divisible_by,
        "mamba_state_dim": h.mamba_state_dim,
        "mamba_head_dim": h.mamba_head_dim,
        "mamba_num_groups": h.mamba_num_groups,
        "mamba_num_heads": h.mamba_num_heads,
        "mamba_chunk_size": h.mamba_chunk_size,
        "init_method_std": a.init_method_std,
        "hidden_dropout": a.hidden_dropout,
        "attention_dropout": a.attention_dropout,
        "layernorm_epsilon": a.norm_epsilon,
        "seed": a.seed,
        "normalization": a.normalization,
        "untie_embeddings_and_output_weights": a.untie_embeddings_and_output_weights,
    });
    if let Some(m) = c.as_object_mut() {
        m.retain(|_, v| !v.is_null());
        // Mixed precision only when asked (SPEC §6.7, docs/mixed_precision.md).
        if a.recompute_granularity.as_deref() == Some("full") {
            let method = a.recompute_method.clone().unwrap_or_default();
            m.insert("recompute".into(), json!({"method": method, "num_layers": a.recompute_num_layers.unwrap_or(1)}));
        }
        let dtype = if a.bf16 {
            Some("bf16")
        } else if a.fp16 {
            Some("f16")
        } else {
            None
        };
        if let Some(d) = dtype {
            m.insert("params_dtype".into(), json!(d));
            if a.fp32_residual_connection {
                m.insert("fp32_residual_connection".into(), json!(true));
            }
        }
    }
    c
}
