//! [`T5Config`]: the `t5` model plugin's configuration (Megatron's flag names in snake_case,
//! SPEC §4.9), its validation and vocabulary padding (SPEC §3.2).

use anyhow::{bail, Result};
use megatron_core::DType;
use megatron_transformer::{NormKind, Precision};
use serde::{Deserialize, Serialize};

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
fn default_buckets() -> usize {
    32
}
fn default_max_distance() -> usize {
    128
}
fn default_activation() -> T5Activation {
    T5Activation::Gelu
}

/// The feed-forward activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum T5Activation {
    /// GeLU, tanh approximation (Megatron's default for T5, fused bias-GeLU).
    Gelu,
    /// ReLU (the original T5 v1.0 feed-forward).
    Relu,
    /// `gelu_tanh(x W_gate) * (x W_up)` (T5 v1.1 "gated-gelu"); fc1 has `2F` outputs.
    GatedGelu,
}

/// T5 architecture and initialization. Defaults are Megatron's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct T5Config {
    /// `--encoder-num-layers` (or `--num-layers`).
    pub encoder_num_layers: usize,
    /// `--decoder-num-layers` (or `--num-layers`).
    pub decoder_num_layers: usize,
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    /// `--kv-channels`; `None` is `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub kv_channels: Option<usize>,
    /// `--ffn-hidden-size`; default `4 * hidden_size`.
    #[serde(default)]
    pub ffn_hidden_size: Option<usize>,
    /// `--encoder-seq-length`.
    pub encoder_seq_length: usize,
    /// `--decoder-seq-length`.
    pub decoder_seq_length: usize,
    /// Rows of the learned position table (shared by encoder and decoder inputs).
    pub max_position_embeddings: usize,
    /// Unpadded tokenizer vocabulary size (including the `--vocab-extra-ids` sentinels).
    pub vocab_size: usize,
    #[serde(default = "default_divisible_by")]
    pub make_vocab_size_divisible_by: usize,
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
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// `LayerNorm` or `RMSNorm` (T5's `T5LayerNorm`: RMS, no bias).
    #[serde(default = "default_norm")]
    pub normalization: NormKind,
    #[serde(default = "default_activation")]
    pub activation: T5Activation,
    /// `learned_absolute` (Megatron's default) or `relative` (T5's bucketed position bias).
    #[serde(default = "default_position_embedding")]
    pub position_embedding_type: String,
    /// `--relative-attention-num-buckets`.
    #[serde(default = "default_buckets")]
    pub relative_attention_num_buckets: usize,
    /// `--relative-attention-max-distance`.
    #[serde(default = "default_max_distance")]
    pub relative_attention_max_distance: usize,
    /// `false` is `--disable-bias-linear`.
    #[serde(default = "default_true")]
    pub add_bias_linear: bool,
    /// The `[V]` bias of the LM head (`lm_head.output_layer.bias`, Megatron's T5LMHead).
    #[serde(default = "default_true")]
    pub lm_head_bias: bool,
    /// Multiplies `q·k`; `None` is `1/sqrt(kv_channels)` (Megatron). Hugging Face T5 uses 1.
    #[serde(default)]
    pub softmax_scale: Option<f32>,
    /// Multiplies the decoder output before the tied LM head (Hugging Face T5: `h^-0.5`).
    #[serde(default)]
    pub output_scale: Option<f32>,
    /// An LM head of its own (`lm_head.output_layer.weight` `[V, h]`) instead of the word
    /// embedding (Hugging Face T5 v1.1: `tie_word_embeddings: false`).
    #[serde(default)]
    pub untie_embeddings_and_output_weights: bool,
    /// dtype of parameters and activations: `f32`, `bf16` (`--bf16`) or `f16` (`--fp16`); the
    /// fp32 main parameters live in the optimizer, the attention core, relative bias and the
    /// logits/cross-entropy stay fp32 (SPEC §6.7, docs/mixed_precision.md).
    #[serde(default = "default_dtype", skip_serializing_if = "is_f32")]
    pub params_dtype: DType,
    /// `--recompute-granularity full` (SPEC §6.9): units over each stack's layers (encoder and
    /// decoder separately, as [`megatron_transformer::FullRecompute`] over a stage); `None`
    /// keeps every activation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recompute: Option<megatron_transformer::FullRecompute>,
}

fn default_dtype() -> DType {
    DType::F32
}
fn is_f32(d: &DType) -> bool {
    *d == DType::F32
}

impl T5Config {
    /// A config with Megatron's defaults for everything but the sizes.
    pub fn new(layers: usize, hidden: usize, heads: usize, enc_seq: usize, dec_seq: usize, vocab: usize) -> T5Config {
        T5Config {
            encoder_num_layers: layers,
            decoder_num_layers: layers,
            hidden_size: hidden,
            num_attention_heads: heads,
            kv_channels: None,
            ffn_hidden_size: None,
            encoder_seq_length: enc_seq,
            decoder_seq_length: dec_seq,
            max_position_embeddings: enc_seq.max(dec_seq),
            vocab_size: vocab,
            make_vocab_size_divisible_by: default_divisible_by(),
            padded_vocab_size: None,
            init_method_std: default_init_std(),
            hidden_dropout: default_dropout(),
            attention_dropout: default_dropout(),
            layernorm_epsilon: default_eps(),
            seed: default_seed(),
            normalization: default_norm(),
            activation: default_activation(),
            position_embedding_type: default_position_embedding(),
            relative_attention_num_buckets: default_buckets(),
            relative_attention_max_distance: default_max_distance(),
            add_bias_linear: true,
            lm_head_bias: true,
            softmax_scale: None,
            output_scale: None,
            untie_embeddings_and_output_weights: false,
            params_dtype: DType::F32,
            recompute: None,
        }
    }

    /// The dtypes the modules are built with (residual stream in `params_dtype`).
    pub fn precision(&self) -> Result<Precision> {
        Precision::new(self.params_dtype, false)
    }

    pub fn head_dim(&self) -> usize {
        self.kv_channels.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    pub fn ffn_hidden_size(&self) -> usize {
        self.ffn_hidden_size.unwrap_or(4 * self.hidden_size)
    }

    pub fn relative(&self) -> bool {
        self.position_embedding_type == "relative"
    }

    pub fn softmax_scale(&self) -> f32 {
        self.softmax_scale.unwrap_or(1.0 / (self.head_dim() as f32).sqrt())
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

    /// Checks the sizes against each other and the tensor-parallel size.
    pub fn validate(&self, tp: usize) -> Result<()> {
        let mut errs = Vec::new();
        if !matches!(self.position_embedding_type.as_str(), "learned_absolute" | "relative") {
            errs.push(format!(
                "--position-embedding-type {} is not supported by t5; use learned_absolute or relative",
                self.position_embedding_type
            ));
        }
        if self.encoder_num_layers == 0 || self.decoder_num_layers == 0 {
            errs.push("t5 needs --encoder-num-layers and --decoder-num-layers >= 1".to_string());
        }
        if self.hidden_size == 0 || self.num_attention_heads == 0 || self.head_dim() == 0 {
            errs.push("t5 needs --hidden-size, --num-attention-heads and --kv-channels >= 1".to_string());
        }
        if self.kv_channels.is_none()
            && self.num_attention_heads > 0
            && !self.hidden_size.is_multiple_of(self.num_attention_heads)
        {
            errs.push(format!(
                "--hidden-size {} is not divisible by --num-attention-heads {}; set --kv-channels",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if !self.num_attention_heads.is_multiple_of(tp.max(1)) {
            errs.push(format!(
                "--num-attention-heads {} must be divisible by --tensor-model-parallel-size {tp}",
                self.num_attention_heads
            ));
        }
        if !self.ffn_hidden_size().is_multiple_of(tp.max(1)) {
            errs.push(format!(
                "--ffn-hidden-size {} must be divisible by --tensor-model-parallel-size {tp}",
                self.ffn_hidden_size()
            ));
        }
        if !self.relative() && self.max_position_embeddings < self.encoder_seq_length.max(self.decoder_seq_length) {
            errs.push(format!(
                "--max-position-embeddings {} is smaller than --encoder-seq-length {} / --decoder-seq-length {}",
                self.max_position_embeddings, self.encoder_seq_length, self.decoder_seq_length
            ));
        }
        if self.relative() && (self.relative_attention_num_buckets < 2 || self.relative_attention_max_distance < 2) {
            errs.push(
                "--relative-attention-num-buckets and --relative-attention-max-distance must be >= 2".to_string(),
            );
        }
        if self.encoder_seq_length == 0 || self.decoder_seq_length == 0 {
            errs.push("t5 needs --encoder-seq-length and --decoder-seq-length >= 1".to_string());
        }
        if !errs.is_empty() {
            bail!("invalid t5 config:\n  {}", errs.join("\n  "));
        }
        self.padded_vocab_size(tp).map(|_| ())
    }

    /// `output_layer_init_method` std: `std / sqrt(2 L)` with `L` the layers of the stack.
    pub fn output_init_std(&self, layers: usize) -> f32 {
        self.init_method_std / (2.0 * layers as f32).sqrt()
    }
}
