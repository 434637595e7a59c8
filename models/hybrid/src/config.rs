//! [`HybridConfig`]: the `hybrid` / `mamba` model plugin's configuration (Megatron's flag
//! names in snake_case, SPEC §4.11 and §4.15.1) and the layer pattern (`M` Mamba-2 mixer,
//! `*` self-attention, `-` MLP).

use anyhow::{bail, Result};
use megatron_core::DType;
use megatron_transformer::{FullRecompute, NormKind, Precision, TransformerConfig};
use serde::{Deserialize, Serialize};

/// What one layer of the pattern is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    Mamba,
    Attention,
    Mlp,
    /// `E`: an MoE layer (pre-MLP norm + the MLP slot filled by the `mlp` plugin, `moe`).
    Moe,
}

/// Parses `--hybrid-layer-pattern` (`M`, `*`, `-`, `E`; `|` pipeline-stage boundaries are
/// skipped here, see [`stage_segments`]); `/` (MTP) is refused with what to use instead. `E`
/// layers need the MoE plugin (checked when the model is built).
pub fn parse_pattern(pattern: &str) -> Result<Vec<LayerKind>> {
    pattern
        .chars()
        .enumerate()
        .filter(|(_, c)| *c != '|')
        .map(|(i, c)| match c {
            'M' => Ok(LayerKind::Mamba),
            '*' => Ok(LayerKind::Attention),
            '-' => Ok(LayerKind::Mlp),
            'E' => Ok(LayerKind::Moe),
            '/' => bail!(
                "--hybrid-layer-pattern `{pattern}`: symbol `{c}` at {i} (MTP) is not implemented by the hybrid model \
                 yet; use only `M` (Mamba-2), `*` (attention), `-` (MLP), `E` (MoE) and `|` (stage boundaries)"
            ),
            _ => {
                bail!("--hybrid-layer-pattern `{pattern}`: unknown symbol `{c}` at {i}; use `M`, `*`, `-`, `E` or `|`")
            }
        })
        .collect()
}

/// The global layer numbers of every pipeline stage (Megatron-Core's
/// `select_pipeline_segment`): with `|` in the pattern its segments are the stages (one per
/// pipeline rank; a segment may be empty), without it the layers are split evenly. At pp = 1
/// the one stage holds every layer whatever the pipes say.
pub fn stage_segments(pattern: &str, pp: usize) -> Result<Vec<std::ops::Range<usize>>> {
    let segments: Vec<usize> = pattern.split('|').map(|s| s.chars().count()).collect();
    let total: usize = segments.iter().sum();
    let sizes = if pp == 1 {
        vec![total] // one stage holds every layer (a `|` checkpoint loads at pp = 1)
    } else if segments.len() > 1 {
        if segments.len() != pp {
            bail!(
                "--hybrid-layer-pattern `{pattern}` has {} pipeline segments (`|`) but \
                 --pipeline-model-parallel-size is {pp}; give one segment per stage",
                segments.len()
            );
        }
        segments
    } else {
        if pp == 0 || !total.is_multiple_of(pp) {
            bail!(
                "{total} layers cannot be split evenly over --pipeline-model-parallel-size {pp}; mark the \
                 stage boundaries with `|` in --hybrid-layer-pattern (e.g. `M*M-|M*M-`)"
            );
        }
        vec![total / pp; pp]
    };
    let mut at = 0;
    Ok(sizes
        .into_iter()
        .map(|n| {
            at += n;
            at - n..at
        })
        .collect())
}

fn d_state() -> usize {
    128
}
fn d_head() -> usize {
    64
}
fn d_groups() -> usize {
    8
}
fn d_conv() -> usize {
    4
}
fn d_expand() -> usize {
    2
}
fn d_chunk() -> usize {
    128
}
fn d_divisible() -> usize {
    128
}
fn d_std() -> f32 {
    0.02
}
fn d_dropout() -> f32 {
    0.1
}
fn d_eps() -> f32 {
    1e-5
}
fn d_seed() -> u64 {
    1234
}
fn d_norm() -> NormKind {
    NormKind::RMSNorm
}
fn d_dtype() -> DType {
    DType::F32
}
fn is_f32(d: &DType) -> bool {
    *d == DType::F32
}
fn is_false(b: &bool) -> bool {
    !*b
}

/// Architecture and initialisation of a hybrid model. Defaults are Megatron's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HybridConfig {
    /// One symbol per layer: `M` Mamba-2, `*` attention, `-` MLP.
    pub hybrid_layer_pattern: String,
    pub hidden_size: usize,
    /// Heads of the attention layers.
    pub num_attention_heads: usize,
    /// MLP inner size of the `-` layers; default `4 * hidden_size`.
    #[serde(default)]
    pub ffn_hidden_size: Option<usize>,
    pub seq_length: usize,
    pub vocab_size: usize,
    #[serde(default = "d_divisible")]
    pub make_vocab_size_divisible_by: usize,
    /// `--mamba-state-dim` (N).
    #[serde(default = "d_state")]
    pub mamba_state_dim: usize,
    /// `--mamba-head-dim` (P).
    #[serde(default = "d_head")]
    pub mamba_head_dim: usize,
    /// `--mamba-num-groups` (G, groups of B and C).
    #[serde(default = "d_groups")]
    pub mamba_num_groups: usize,
    /// `--mamba-num-heads` (H); default `d_inner / head_dim`.
    #[serde(default)]
    pub mamba_num_heads: Option<usize>,
    /// d_inner = expand · hidden (when the heads are not given).
    #[serde(default = "d_expand")]
    pub mamba_expand: usize,
    /// Width of the causal depthwise conv.
    #[serde(default = "d_conv")]
    pub mamba_conv_kernel: usize,
    /// Steps per chunk of the SSD scan.
    #[serde(default = "d_chunk")]
    pub mamba_chunk_size: usize,
    #[serde(default = "d_std")]
    pub init_method_std: f32,
    #[serde(default = "d_dropout")]
    pub hidden_dropout: f32,
    #[serde(default = "d_dropout")]
    pub attention_dropout: f32,
    #[serde(default = "d_eps")]
    pub layernorm_epsilon: f32,
    #[serde(default = "d_seed")]
    pub seed: u64,
    /// Norm of every layer and the final norm (Megatron's hybrid models use RMSNorm).
    #[serde(default = "d_norm")]
    pub normalization: NormKind,
    #[serde(default)]
    pub untie_embeddings_and_output_weights: bool,
    /// dtype of parameters and activations: `f32`, `bf16` (`--bf16`) or `f16` (`--fp16`); the
    /// fp32 main parameters live in the optimizer (SPEC §6.7). The Mamba mixer's scan runs in
    /// fp32 inside (see [`crate::mixer`]).
    #[serde(default = "d_dtype", skip_serializing_if = "is_f32")]
    pub params_dtype: DType,
    /// `--fp32-residual-connection`: the residual stream stays fp32 in a half model.
    #[serde(default, skip_serializing_if = "is_false")]
    pub fp32_residual_connection: bool,
    /// `--recompute-granularity full` with its method and unit size (SPEC §6.9), over the
    /// layers of each pipeline stage as the GPT's ([`megatron_transformer::recompute`]); `None`
    /// keeps every activation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recompute: Option<FullRecompute>,
}

impl HybridConfig {
    /// Megatron's defaults for everything but the sizes.
    pub fn new(
        pattern: &str,
        hidden_size: usize,
        num_attention_heads: usize,
        seq_length: usize,
        vocab_size: usize,
    ) -> Self {
        HybridConfig {
            hybrid_layer_pattern: pattern.to_string(),
            hidden_size,
            num_attention_heads,
            ffn_hidden_size: None,
            seq_length,
            vocab_size,
            make_vocab_size_divisible_by: d_divisible(),
            mamba_state_dim: d_state(),
            mamba_head_dim: d_head(),
            mamba_num_groups: d_groups(),
            mamba_num_heads: None,
            mamba_expand: d_expand(),
            mamba_conv_kernel: d_conv(),
            mamba_chunk_size: d_chunk(),
            init_method_std: d_std(),
            hidden_dropout: d_dropout(),
            attention_dropout: d_dropout(),
            layernorm_epsilon: d_eps(),
            seed: d_seed(),
            normalization: d_norm(),
            untie_embeddings_and_output_weights: false,
            params_dtype: d_dtype(),
            fp32_residual_connection: false,
            recompute: None,
        }
    }

    /// The dtypes the modules are built with (see `megatron_transformer::precision`).
    pub fn precision(&self) -> Result<Precision> {
        Precision::new(self.params_dtype, self.fp32_residual_connection)
    }

    pub fn layers(&self) -> Result<Vec<LayerKind>> {
        parse_pattern(&self.hybrid_layer_pattern)
    }

    /// Mamba heads H.
    pub fn mamba_heads(&self) -> usize {
        self.mamba_num_heads.unwrap_or(self.mamba_expand * self.hidden_size / self.mamba_head_dim.max(1))
    }

    /// d_inner = H · P.
    pub fn d_inner(&self) -> usize {
        self.mamba_heads() * self.mamba_head_dim
    }

    pub fn ffn_hidden_size(&self) -> usize {
        self.ffn_hidden_size.unwrap_or(4 * self.hidden_size)
    }

    /// `ceil(vocab / m) * m` with `m = make_vocab_size_divisible_by * tp` (SPEC §3.2).
    pub fn padded_vocab_size(&self, tp: usize) -> usize {
        let m = self.make_vocab_size_divisible_by.max(1) * tp;
        self.vocab_size.div_ceil(m) * m
    }

    /// Everything checked at once, with the flag to change.
    pub fn validate(&self, tp: usize) -> Result<()> {
        let layers = self.layers()?;
        let mut e = Vec::new();
        if layers.is_empty() {
            e.push("--hybrid-layer-pattern is empty; give one symbol per layer (e.g. `M-M*-`)".to_string());
        }
        let (h, p, g) = (self.mamba_heads(), self.mamba_head_dim, self.mamba_num_groups);
        if h == 0 || p == 0 || g == 0 || self.mamba_state_dim == 0 {
            e.push(format!(
                "mamba heads {h} (--mamba-num-heads or expand·hidden/head-dim), --mamba-head-dim {p}, \
                 --mamba-num-groups {g} and --mamba-state-dim {} must all be >= 1",
                self.mamba_state_dim
            ));
        } else if !h.is_multiple_of(g) {
            e.push(format!("mamba heads {h} must be a multiple of --mamba-num-groups {g}"));
        }
        if !h.is_multiple_of(tp) || !g.is_multiple_of(tp) {
            e.push(format!("mamba heads {h} and --mamba-num-groups {g} must be divisible by tp {tp}"));
        }
        if self.mamba_conv_kernel == 0 || self.mamba_chunk_size == 0 {
            e.push("the conv kernel and the chunk size must be >= 1".into());
        }
        if layers.contains(&LayerKind::Attention)
            && (self.num_attention_heads == 0 || !self.hidden_size.is_multiple_of(self.num_attention_heads))
        {
            e.push(format!(
                "--hidden-size {} must be a multiple of --num-attention-heads {} for the `*` layers",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if self.vocab_size == 0 || self.seq_length == 0 {
            e.push("vocab_size and seq_length must be >= 1".into());
        }
        if self.recompute.is_some_and(|r| r.num_layers == 0) {
            e.push("--recompute-num-layers must be at least 1".into());
        }
        if let Err(err) = self.precision() {
            e.push(format!("params_dtype: {err}"));
        }
        if !e.is_empty() {
            bail!("invalid hybrid model config:\n  - {}", e.join("\n  - "));
        }
        Ok(())
    }

    /// The sizes the transformer crate's attention and MLP need (no rotary: positions come
    /// only from the Mamba layers and the causal mask, as Megatron's `position_embedding_type
    /// = none`).
    pub fn transformer_config(&self) -> TransformerConfig {
        TransformerConfig {
            num_layers: self.layers().map(|l| l.len()).unwrap_or(0),
            hidden_size: self.hidden_size,
            num_attention_heads: self.num_attention_heads.max(1),
            ffn_hidden_size: self.ffn_hidden_size(),
            layernorm_epsilon: self.layernorm_epsilon,
            hidden_dropout: self.hidden_dropout,
            attention_dropout: self.attention_dropout,
            init_method_std: self.init_method_std,
            num_query_groups: None,
            kv_channels: None,
            rotary: None,
            qk_layernorm: None,
        }
    }

    /// Model FLOPs of one iteration: the matmuls (6 per parameter per token), the causal
    /// attention scores and the SSD scan (intra-chunk quadratic form + state passing).
    pub fn flops_per_iteration(&self, samples: usize, tp: usize) -> f64 {
        let (c, s) = (self.hidden_size as f64, self.seq_length as f64);
        let (h, p, n, g) = (
            self.mamba_heads() as f64,
            self.mamba_head_dim as f64,
            self.mamba_state_dim as f64,
            self.mamba_num_groups as f64,
        );
        let di = h * p;
        let q = (self.mamba_chunk_size as f64).min(s);
        let mut per_token = 6.0 * c * self.padded_vocab_size(tp) as f64;
        for k in self.layers().unwrap_or_default() {
            per_token += match k {
                LayerKind::Mamba => {
                    6.0 * c * (2.0 * di + 2.0 * g * n + h) + 6.0 * di * c + 3.0 * h * (q * (n + p) + 2.0 * n * p) * 2.0
                }
                LayerKind::Attention => 6.0 * 4.0 * c * c + 6.0 * s * c,
                // MoE: counted as one dense MLP (the top-k and expert sizes are the plugin's config)
                LayerKind::Mlp | LayerKind::Moe => 6.0 * 2.0 * c * self.ffn_hidden_size() as f64,
            };
        }
        samples as f64 * s * per_token
    }
}

/// Megatron's automatic layer allocation (SPEC §4.11, `hybrid_layer_allocation.py`) for
/// `num_layers` layers from `--hybrid-attention-ratio` and `--hybrid-mlp-ratio`: attention
/// layers spread evenly between `a + 1` Mamba sections, then MLPs likewise among the remaining
/// `M` layers. Counts are rounded half-to-even as Python's `round`.
pub fn allocate_pattern(num_layers: usize, attention_ratio: f64, mlp_ratio: f64) -> Result<String> {
    if !(0.0..=1.0).contains(&attention_ratio) || !(0.0..=1.0).contains(&mlp_ratio) || attention_ratio + mlp_ratio > 1.0
    {
        bail!("--hybrid-attention-ratio {attention_ratio} and --hybrid-mlp-ratio {mlp_ratio} must be in [0, 1] with a sum <= 1");
    }
    let l = num_layers as f64;
    let mut layers = vec!['M'; num_layers];
    let a = (l * attention_ratio).round_ties_even() as usize;
    if a > 0 {
        let m = (l - a as f64) / (a as f64 + 1.0);
        let mut x = m;
        for c in layers.iter_mut() {
            if x < 0.5 {
                *c = '*';
                x += m;
            } else {
                x -= 1.0;
            }
        }
    }
    let k = (l * mlp_ratio).round_ties_even() as usize;
    if k > 0 {
        let n_m = layers.iter().filter(|c| **c == 'M').count();
        let r = (n_m as f64 - k as f64) / k as f64;
        let mut x = r;
        for c in layers.iter_mut().filter(|c| **c == 'M') {
            if x < 0.5 {
                *c = '-';
                x += r;
            } else {
                x -= 1.0;
            }
        }
    }
    Ok(layers.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::allocate_pattern;

    #[test]
    fn stages_follow_the_pipes_or_split_evenly() {
        use super::stage_segments;
        assert_eq!(stage_segments("M*-M|M*-", 2).unwrap(), vec![0..4, 4..7]);
        assert_eq!(stage_segments("M-M*-M-M*-", 2).unwrap(), vec![0..5, 5..10]);
        assert_eq!(stage_segments("M*|", 2).unwrap(), vec![0..2, 2..2]);
        assert!(stage_segments("M*-", 2).unwrap_err().to_string().contains("evenly"));
        assert!(stage_segments("M|*|-", 2).unwrap_err().to_string().contains("3 pipeline segments"));
        assert_eq!(stage_segments("M|*|-", 1).unwrap(), vec![0..3]);
        assert_eq!(super::parse_pattern("M|*-").unwrap().len(), 3);
    }

    #[test]
    fn allocation_matches_the_spec_examples() {
        assert_eq!(allocate_pattern(8, 0.25, 0.0).unwrap(), "MM*MM*MM");
        assert_eq!(allocate_pattern(8, 0.25, 0.25).unwrap(), "MM*-M*M-");
        assert_eq!(allocate_pattern(24, 0.125, 0.0).unwrap(), "MMMMM*MMMMMM*MMMMM*MMMMM");
        assert_eq!(allocate_pattern(4, 0.0, 0.0).unwrap(), "MMMM");
        assert!(allocate_pattern(4, 0.8, 0.5).is_err());
    }
}
