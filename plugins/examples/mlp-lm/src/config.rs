//! [`MlpLmConfig`], the configuration of the `swiglu-mlp-lm` model plugin.
//!
//! The driver (`megatron pretrain`) passes every model a GPT-shaped config (src/config.rs
//! `model_config`). This plugin accepts those fields so it trains from the same flags; the
//! ones that describe parts this architecture does not have (attention, positions, dropout, the
//! choice of norm/activation/tying, which are fixed here) are accepted and ignored. Any other
//! field is an error listing the known ones (`deny_unknown_fields`).

use megatron_core::DType;
use serde::de::IgnoredAny;
use serde::Deserialize;

fn default_divisible_by() -> usize {
    128
}
fn default_std() -> f32 {
    0.02
}
fn default_eps() -> f32 {
    1e-5
}
fn default_seed() -> u64 {
    1234
}
fn default_dtype() -> DType {
    DType::F32
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlpLmConfig {
    pub num_layers: usize,
    pub hidden_size: usize,
    /// Width `F` of the SwiGLU MLP (fc1 is `2F x H`); default `2 * hidden_size`.
    #[serde(default)]
    pub ffn_hidden_size: Option<usize>,
    /// Unpadded vocabulary; padded up to a multiple of `make_vocab_size_divisible_by`.
    pub vocab_size: usize,
    #[serde(default = "default_divisible_by")]
    pub make_vocab_size_divisible_by: usize,
    #[serde(default = "default_std")]
    pub init_method_std: f32,
    /// RMSNorm epsilon (the driver's `--norm-epsilon`).
    #[serde(default = "default_eps")]
    pub layernorm_epsilon: f32,
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Sequence length, used only to report FLOPs.
    #[serde(default)]
    pub seq_length: Option<usize>,
    /// Panics in `forward`: shows (and tests) that the host turns a plugin panic into an error.
    #[serde(default)]
    pub panic_in_forward: bool,
    /// dtype of parameters and activations: `f32` (default), `bf16` (`--bf16`) or `f16`
    /// (`--fp16`). Gradients stay fp32 (the driver's mixed-precision optimizer keeps the fp32
    /// main parameters); norm statistics and the cross-entropy statistics are fp32.
    #[serde(default = "default_dtype")]
    pub params_dtype: DType,

    // ---- accepted from the driver's GPT-shaped config, ignored (see the module doc) ----------
    #[serde(default)]
    pub num_attention_heads: Option<IgnoredAny>,
    #[serde(default)]
    pub max_position_embeddings: Option<IgnoredAny>,
    #[serde(default)]
    pub hidden_dropout: Option<IgnoredAny>,
    #[serde(default)]
    pub attention_dropout: Option<IgnoredAny>,
    #[serde(default)]
    pub normalization: Option<IgnoredAny>,
    #[serde(default)]
    pub swiglu: Option<IgnoredAny>,
    #[serde(default)]
    pub position_embedding_type: Option<IgnoredAny>,
    #[serde(default)]
    pub untie_embeddings_and_output_weights: Option<IgnoredAny>,
}

impl MlpLmConfig {
    /// A config with only the required fields set (tests and programmatic use).
    pub fn new(num_layers: usize, hidden_size: usize, vocab_size: usize) -> MlpLmConfig {
        MlpLmConfig {
            num_layers,
            hidden_size,
            ffn_hidden_size: None,
            vocab_size,
            make_vocab_size_divisible_by: default_divisible_by(),
            init_method_std: default_std(),
            layernorm_epsilon: default_eps(),
            seed: default_seed(),
            seq_length: None,
            panic_in_forward: false,
            params_dtype: DType::F32,
            num_attention_heads: None,
            max_position_embeddings: None,
            hidden_dropout: None,
            attention_dropout: None,
            normalization: None,
            swiglu: None,
            position_embedding_type: None,
            untie_embeddings_and_output_weights: None,
        }
    }

    pub fn ffn(&self) -> usize {
        self.ffn_hidden_size.unwrap_or(2 * self.hidden_size)
    }

    /// The vocabulary padded as Megatron pads it (tensor parallel size 1).
    pub fn padded_vocab(&self) -> usize {
        let m = self.make_vocab_size_divisible_by.max(1);
        self.vocab_size.div_ceil(m) * m
    }
}
