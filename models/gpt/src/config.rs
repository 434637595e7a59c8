//! [`GptConfig`]: the `gpt` model plugin's configuration (Megatron's flag names in
//! snake_case), its validation, vocabulary padding (SPEC §3.2) and FLOPs (SPEC §6.13).

use anyhow::{bail, Result};
use megatron_core::{DType, RopeScaling};
use megatron_transformer::{FullRecompute, NormKind, Precision, RotaryConfig, TransformerConfig};
use serde::{Deserialize, Serialize};
use std::ops::Range;

fn default_divisible_by() -> usize {
    128
}
fn default_init_std() -> f32 {
    0.02
}
fn default_dropout() -> f32 {
    0.1
}
fn default_eps() -> f32 {
    1e-5
}
fn default_seed() -> u64 {
    1234
}
fn default_norm() -> NormKind {
    NormKind::LayerNorm
}
fn default_position_embedding() -> String {
    "learned_absolute".to_string()
}
fn default_true() -> bool {
    true
}
fn default_rotary_base() -> f32 {
    10000.0
}
fn default_one() -> f32 {
    1.0
}
fn is_false(b: &bool) -> bool {
    !*b
}
fn default_dtype() -> DType {
    DType::F32
}
fn is_f32(d: &DType) -> bool {
    *d == DType::F32
}

/// GPT architecture and initialization. Defaults are Megatron's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GptConfig {
    pub num_layers: usize,
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    /// MLP inner size; default `4 * hidden_size`.
    #[serde(default)]
    pub ffn_hidden_size: Option<usize>,
    pub seq_length: usize,
    pub max_position_embeddings: usize,
    /// Unpadded tokenizer vocabulary size.
    pub vocab_size: usize,
    #[serde(default = "default_divisible_by")]
    pub make_vocab_size_divisible_by: usize,
    /// Overrides the padding rule (`--padded-vocab-size`, e.g. restored from a checkpoint).
    #[serde(default)]
    pub padded_vocab_size: Option<usize>,
    #[serde(default = "default_init_std")]
    pub init_method_std: f32,
    #[serde(default = "default_dropout")]
    pub hidden_dropout: f32,
    #[serde(default = "default_dropout")]
    pub attention_dropout: f32,
    #[serde(default = "default_eps")]
    pub layernorm_epsilon: f32,
    /// Base seed of the parameter initialization.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// `LayerNorm` or `RMSNorm`.
    #[serde(default = "default_norm")]
    pub normalization: NormKind,
    #[serde(default)]
    pub swiglu: bool,
    /// `learned_absolute` (a position table) or `rope` (rotary q/k in every attention).
    #[serde(default = "default_position_embedding")]
    pub position_embedding_type: String,
    /// `--rotary-base`.
    #[serde(default = "default_rotary_base")]
    pub rotary_base: f32,
    /// `--rotary-percent`.
    #[serde(default = "default_one")]
    pub rotary_percent: f32,
    /// `--rotary-interleaved`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub rotary_interleaved: bool,
    /// Rescaled rotary frequencies: Llama-3.1's (`--use-rope-scaling --rope-scaling-factor`)
    /// or linear position interpolation (`--rotary-seq-len-interpolation-factor`).
    #[serde(default, skip_serializing_if = "RopeScaling::is_none")]
    pub rope_scaling: RopeScaling,
    /// `--qk-layernorm`: a `normalization` norm over `head_dim` of every query and key.
    #[serde(default, skip_serializing_if = "is_false")]
    pub qk_layernorm: bool,
    /// `--num-query-groups` (with `--group-query-attention`); `None` is multi-head attention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_query_groups: Option<usize>,
    /// `--kv-channels`; `None` is `hidden_size / num_attention_heads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_channels: Option<usize>,
    /// `--add-qkv-bias`: a bias on linear_qkv even with `--disable-bias-linear`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub add_qkv_bias: bool,
    #[serde(default)]
    pub untie_embeddings_and_output_weights: bool,
    /// `false` is `--disable-bias-linear`.
    #[serde(default = "default_true")]
    pub add_bias_linear: bool,
    /// Decoder layers of the first pipeline stage (`--decoder-first-pipeline-num-layers`);
    /// `None` splits evenly (SPEC §5.5, see [`crate::pipeline_split`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decoder_first_pipeline_num_layers: Option<usize>,
    /// Decoder layers of the last pipeline stage (`--decoder-last-pipeline-num-layers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decoder_last_pipeline_num_layers: Option<usize>,
    /// dtype of parameters and activations: `f32`, `bf16` (`--bf16`) or `f16` (`--fp16`); the
    /// fp32 main parameters live in the optimizer (SPEC §6.7).
    #[serde(default = "default_dtype", skip_serializing_if = "is_f32")]
    pub params_dtype: DType,
    /// `--fp32-residual-connection`: the residual stream stays fp32 in a half model.
    #[serde(default, skip_serializing_if = "is_false")]
    pub fp32_residual_connection: bool,
    /// `--grad-reduce-in-bf16`: bf16 gradient buffers instead of fp32 ones (bf16 models).
    #[serde(default, skip_serializing_if = "is_false")]
    pub grad_reduce_in_bf16: bool,
    /// `--sequence-parallel` (SPEC §5.3): norms, dropouts and residuals on token shards of the
    /// TP group. Ignored at tp = 1 (a tp = 1 run or a resharded checkpoint just runs without it).
    #[serde(default, skip_serializing_if = "is_false")]
    pub sequence_parallel: bool,
    /// `--recompute-granularity full` with its method and unit size (SPEC §6.9); `None` keeps
    /// every activation (selective `core_attn` recomputation is what attention always does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recompute: Option<FullRecompute>,
}

impl GptConfig {
    /// A config with Megatron's defaults for everything but the sizes.
    pub fn new(
        num_layers: usize,
        hidden_size: usize,
        num_attention_heads: usize,
        seq_length: usize,
        vocab_size: usize,
    ) -> GptConfig {
        GptConfig {
            num_layers,
            hidden_size,
            num_attention_heads,
            ffn_hidden_size: None,
            seq_length,
            max_position_embeddings: seq_length,
            vocab_size,
            make_vocab_size_divisible_by: default_divisible_by(),
            padded_vocab_size: None,
            init_method_std: default_init_std(),
            hidden_dropout: default_dropout(),
            attention_dropout: default_dropout(),
            layernorm_epsilon: default_eps(),
            seed: default_seed(),
            normalization: default_norm(),
            swiglu: false,
            position_embedding_type: default_position_embedding(),
            rotary_base: default_rotary_base(),
            rotary_percent: 1.0,
            rotary_interleaved: false,
            rope_scaling: RopeScaling::None,
            qk_layernorm: false,
            num_query_groups: None,
            kv_channels: None,
            add_qkv_bias: false,
            untie_embeddings_and_output_weights: false,
            add_bias_linear: true,
            decoder_first_pipeline_num_layers: None,
            decoder_last_pipeline_num_layers: None,
            params_dtype: DType::F32,
            fp32_residual_connection: false,
            grad_reduce_in_bf16: false,
            sequence_parallel: false,
            recompute: None,
        }
    }

    /// The dtypes the modules are built with (see `megatron_transformer::precision`).
    pub fn precision(&self) -> Result<Precision> {
        let mut p = Precision::new(self.params_dtype, self.fp32_residual_connection)?;
        if self.grad_reduce_in_bf16 {
            if self.params_dtype != DType::BF16 {
                bail!("grad_reduce_in_bf16 (--grad-reduce-in-bf16) needs bf16 parameters (--bf16)");
            }
            p.grads = DType::BF16;
        }
        Ok(p)
    }

    pub fn ffn_hidden_size(&self) -> usize {
        self.ffn_hidden_size.unwrap_or(4 * self.hidden_size)
    }

    /// `ceil(vocab / m) * m` with `m = make_vocab_size_divisible_by * tp` (SPEC §3.2).
    pub fn padded_vocab_size(&self, tp: usize) -> Result<usize> {
        if let Some(v) = self.padded_vocab_size {
            if v < self.vocab_size || !v.is_multiple_of(tp) {
                bail!(
                    "padded_vocab_size {v} must be >= vocab_size {} and divisible by --tensor-model-parallel-size {tp}",
                    self.vocab_size
                );
            }
            return Ok(v);
        }
        let m = self.make_vocab_size_divisible_by.max(1) * tp;
        Ok(self.vocab_size.div_ceil(m) * m)
    }

    /// Checks everything that does not depend on the transformer sizes' TP divisibility.
    pub fn validate(&self) -> Result<()> {
        if !matches!(self.position_embedding_type.as_str(), "learned_absolute" | "rope") {
            bail!(
                "position_embedding_type `{}` is not implemented by the gpt model; use `learned_absolute` or `rope`",
                self.position_embedding_type
            );
        }
        if self.vocab_size == 0 || self.seq_length == 0 {
            bail!("vocab_size and seq_length must be >= 1");
        }
        if self.max_position_embeddings < self.seq_length && !self.uses_rope() {
            bail!(
                "max_position_embeddings {} < seq_length {}; learned absolute positions need \
                 --max-position-embeddings >= --seq-length",
                self.max_position_embeddings,
                self.seq_length
            );
        }
        if self.init_method_std.is_nan() || self.init_method_std <= 0.0 {
            bail!("init_method_std must be > 0, got {}", self.init_method_std);
        }
        if !self.rope_scaling.is_none() && !self.uses_rope() {
            bail!("rope scaling (--use-rope-scaling / --rotary-seq-len-interpolation-factor) needs --position-embedding-type rope");
        }
        self.rope_scaling.validate()?;
        self.precision()?;
        Ok(())
    }

    /// Rotary positions instead of a learned table.
    pub fn uses_rope(&self) -> bool {
        self.position_embedding_type == "rope"
    }

    /// Global decoder layers of pipeline stage `stage` of `pp` (even or uneven split).
    pub fn stage_layers(&self, pp: usize, stage: usize) -> Result<Range<usize>> {
        let (first, last) = (self.decoder_first_pipeline_num_layers, self.decoder_last_pipeline_num_layers);
        crate::pipeline_split::stage_range(self.num_layers, pp, stage, first, last)
    }

    /// Global layer numbers of model chunk `chunk` of pipeline rank `stage` with `vp` chunks
    /// per rank (interleaved 1F1B, SPEC §5.5): virtual stage `chunk·pp + stage` of `pp·vp`
    /// equal stages, Megatron's layer offset `chunk·L/vp + stage·L/(pp·vp)`. With uneven
    /// first/last stages each rank's layers are split evenly over its chunks and chunk `c` of
    /// every rank comes before chunk `c + 1` (Megatron's `get_transformer_layer_offset`).
    pub fn virtual_stage_layers(&self, pp: usize, vp: usize, stage: usize, chunk: usize) -> Result<Range<usize>> {
        if vp <= 1 {
            return self.stage_layers(pp, stage);
        }
        let (first, last) = (self.decoder_first_pipeline_num_layers, self.decoder_last_pipeline_num_layers);
        if first.is_none() && last.is_none() {
            return crate::pipeline_split::stage_range(self.num_layers, pp * vp, chunk * pp + stage, None, None);
        }
        let split = crate::pipeline_split::pipeline_split(self.num_layers, pp, first, last)?;
        let mut per_chunk = Vec::with_capacity(pp);
        for (s, r) in split.iter().enumerate() {
            if r.len() % vp != 0 {
                anyhow::bail!(
                    "pipeline stage {s} holds {} layers, which do not split over {vp} model chunks per rank; change \
                     --decoder-first/last-pipeline-num-layers or the virtual stages",
                    r.len()
                );
            }
            per_chunk.push(r.len() / vp);
        }
        if stage >= pp || chunk >= vp {
            anyhow::bail!("model chunk {chunk} of pipeline stage {stage} does not exist with pp {pp} x {vp} chunks");
        }
        let start = chunk * self.num_layers / vp + per_chunk[..stage].iter().sum::<usize>();
        Ok(start..start + per_chunk[stage])
    }

    /// The per-layer sizes the transformer crate needs.
    pub fn transformer_config(&self) -> TransformerConfig {
        TransformerConfig {
            num_layers: self.num_layers,
            hidden_size: self.hidden_size,
            num_attention_heads: self.num_attention_heads,
            ffn_hidden_size: self.ffn_hidden_size(),
            layernorm_epsilon: self.layernorm_epsilon,
            hidden_dropout: self.hidden_dropout,
            attention_dropout: self.attention_dropout,
            init_method_std: self.init_method_std,
            num_query_groups: self.num_query_groups,
            kv_channels: self.kv_channels,
            rotary: self.uses_rope().then_some(RotaryConfig {
                base: self.rotary_base,
                percent: self.rotary_percent,
                interleaved: self.rotary_interleaved,
                scaling: self.rope_scaling,
            }),
            qk_layernorm: self.qk_layernorm.then_some(self.normalization),
        }
    }

    /// Model FLOPs of one iteration on `samples` sequences of `seq_length` (SPEC §6.13,
    /// dense MHA GPT, causal attention counted half), with the padded vocabulary of `tp`.
    pub fn flops_per_iteration(&self, samples: usize, tp: usize) -> f64 {
        let (l, h, s) = (self.num_layers as f64, self.hidden_size as f64, self.seq_length as f64);
        let v = self.padded_vocab_size(tp).unwrap_or(self.vocab_size) as f64;
        let glu = if self.swiglu { 1.5 } else { 1.0 };
        // SPEC §6.13 with q_ratio = kv_channels·np/h and g/np for GQA (both 1 for plain MHA).
        let np = self.num_attention_heads as f64;
        let kv = self.kv_channels.map_or(h / np, |k| k as f64);
        let q_ratio = kv * np / h;
        let g_ratio = self.num_query_groups.map_or(1.0, |g| g as f64 / np);
        let attn = 12.0 * l * h * h * ((1.0 + g_ratio + s / (2.0 * h)) * q_ratio);
        let mlp = 12.0 * l * h * self.ffn_hidden_size() as f64 * glu;
        let logits = 6.0 * h * v;
        samples as f64 * s * (mlp + attn + logits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flops_match_the_spec_golden_value() {
        let mut c = GptConfig::new(24, 1024, 16, 1024, 50257);
        c.max_position_embeddings = 1024;
        assert_eq!(c.padded_vocab_size(1).unwrap(), 50304);
        let f = c.flops_per_iteration(8, 1);
        assert!((f - 1.8612240777216e13).abs() / 1.8612240777216e13 < 1e-12, "{f}");
    }

    #[test]
    fn vocab_padding_follows_tp() {
        let c = GptConfig::new(2, 64, 4, 32, 50257);
        assert_eq!(c.padded_vocab_size(1).unwrap(), 50304);
        assert_eq!(c.padded_vocab_size(2).unwrap(), 50432);
        assert_eq!(GptConfig::new(2, 64, 4, 32, 1024).padded_vocab_size(1).unwrap(), 1024);
    }

    #[test]
    fn unknown_fields_and_bad_positions_are_errors() {
        let bad = serde_json::json!({"num_layers": 2, "hidden_size": 8, "num_attention_heads": 2,
            "seq_length": 4, "max_position_embeddings": 4, "vocab_size": 10, "hidden_szie": 3});
        let e = serde_json::from_value::<GptConfig>(bad).unwrap_err().to_string();
        assert!(e.contains("hidden_szie"), "{e}");
        let mut c = GptConfig::new(2, 8, 2, 4, 10);
        c.position_embedding_type = "alibi".into();
        assert!(c.validate().is_err());
        c.position_embedding_type = "rope".into();
        c.validate().unwrap();
        let ok = serde_json::json!({"num_layers": 2, "hidden_size": 8, "num_attention_heads": 2,
            "seq_length": 4, "max_position_embeddings": 4, "vocab_size": 10, "normalization": "RMSNorm"});
        let c: GptConfig = serde_json::from_value(ok).unwrap();
        assert_eq!(c.normalization, NormKind::RMSNorm);
        assert_eq!(c.ffn_hidden_size(), 32);
    }
}
