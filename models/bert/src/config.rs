//! [`BertConfig`]: the sizes and options of a BERT model (Megatron's `pretrain_bert.py` flags,
//! SPEC §4.8), deserialised from the `bert` plugin config (unknown fields are errors).

use anyhow::{bail, Result};
use megatron_core::DType;
use megatron_transformer::{Precision, TransformerConfig};
use serde::Deserialize;

/// Where the LayerNorms sit in each layer.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LayerNormPlacement {
    /// Megatron-Core's layer: `h = x + attn(LN(x))`, `y = h + mlp(LN(h))`, a final LayerNorm.
    #[default]
    Pre,
    /// Original BERT / Hugging Face: a LayerNorm on the embeddings, `h = LN(x + attn(x))`,
    /// `y = LN(h + mlp(h))`, no final LayerNorm.
    Post,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct BertConfig {
    pub num_layers: usize,
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    /// `--ffn-hidden-size`; `None` is `4 * hidden_size`.
    pub ffn_hidden_size: Option<usize>,
    pub max_position_embeddings: usize,
    /// Unpadded vocabulary (the tokenizer's).
    pub vocab_size: usize,
    /// `--make-vocab-size-divisible-by` (the padded size is a multiple of this times tp).
    pub make_vocab_size_divisible_by: usize,
    /// Token-type embeddings (2 with the binary head, Megatron's `num_tokentypes`; 0 = none).
    pub num_tokentypes: usize,
    /// The sentence-order head (`--bert-no-binary-head` turns it off).
    pub bert_binary_head: bool,
    pub layernorm: LayerNormPlacement,
    /// The exact erf GeLU (Hugging Face `hidden_act = "gelu"`) instead of Megatron's tanh form.
    pub gelu_erf: bool,
    pub layernorm_epsilon: f32,
    pub hidden_dropout: f32,
    pub attention_dropout: f32,
    pub init_method_std: f32,
    /// Base seed of the parameter init.
    pub seed: u64,
    /// `Some(s)` (`megatron pretrain --model bert`): a generic `Batch` holds the packed samples
    /// of the `bert` dataset for `--seq-length s` (`src/batch.rs`) and the model reports
    /// Megatron's `lm loss` and `sop loss`; `None`: plain rows of token type 0, LM loss only.
    pub seq_length: Option<usize>,
    /// Encoder layers of the first pipeline stage (`--decoder-first-pipeline-num-layers`);
    /// `None` with `decoder_last_pipeline_num_layers` also `None`: an even split
    /// (`megatron_transformer::pipeline_split`).
    pub decoder_first_pipeline_num_layers: Option<usize>,
    /// Encoder layers of the last pipeline stage (`--decoder-last-pipeline-num-layers`).
    pub decoder_last_pipeline_num_layers: Option<usize>,
    /// dtype of parameters and activations: `f32`, `bf16` (`--bf16`) or `f16` (`--fp16`); the
    /// fp32 main parameters live in the optimizer, gradients are fp32, the attention softmax,
    /// norm statistics, cross-entropy statistics and the binary head's pooler/loss are fp32
    /// (SPEC §6.7, docs/mixed_precision.md).
    pub params_dtype: DType,
    /// `--recompute-granularity full` (SPEC §6.9): units over this stage's encoder layers
    /// ([`megatron_transformer::FullRecompute`]); `None` keeps every activation.
    pub recompute: Option<megatron_transformer::FullRecompute>,
}

impl Default for BertConfig {
    fn default() -> Self {
        BertConfig {
            num_layers: 2,
            hidden_size: 64,
            num_attention_heads: 2,
            ffn_hidden_size: None,
            max_position_embeddings: 512,
            vocab_size: 30522,
            make_vocab_size_divisible_by: 128,
            num_tokentypes: 2,
            bert_binary_head: true,
            layernorm: LayerNormPlacement::Pre,
            gelu_erf: false,
            layernorm_epsilon: 1e-5,
            hidden_dropout: 0.1,
            attention_dropout: 0.1,
            init_method_std: 0.02,
            seed: 1234,
            seq_length: None,
            decoder_first_pipeline_num_layers: None,
            decoder_last_pipeline_num_layers: None,
            params_dtype: DType::F32,
            recompute: None,
        }
    }
}

impl BertConfig {
    /// The dtypes the modules are built with (residual stream in `params_dtype`).
    pub fn precision(&self) -> Result<Precision> {
        Precision::new(self.params_dtype, false)
    }

    pub fn ffn(&self) -> usize {
        self.ffn_hidden_size.unwrap_or(4 * self.hidden_size)
    }

    /// The vocabulary padded to a multiple of `make_vocab_size_divisible_by * tp` (SPEC §3.2).
    pub fn padded_vocab_size(&self, tp: usize) -> Result<usize> {
        let m = self.make_vocab_size_divisible_by.max(1) * tp;
        Ok(self.vocab_size.div_ceil(m) * m)
    }

    pub fn validate(&self) -> Result<()> {
        if self.vocab_size == 0 || self.max_position_embeddings == 0 {
            bail!("bert: vocab_size and max_position_embeddings must be >= 1");
        }
        if self.seq_length.is_some_and(|s| s == 0 || s > self.max_position_embeddings) {
            bail!(
                "bert: --seq-length {:?} must be in 1..={} (--max-position-embeddings)",
                self.seq_length,
                self.max_position_embeddings
            );
        }
        if self.bert_binary_head && self.num_tokentypes == 0 {
            bail!(
                "bert: the binary head needs token types (num_tokentypes = 2); use --bert-no-binary-head or set them"
            );
        }
        self.transformer_config().validate(1)
    }

    /// Global encoder layers of pipeline stage `stage` of `pp` (even, or uneven with the
    /// first/last counts; SPEC §5.5).
    pub fn stage_layers(&self, pp: usize, stage: usize) -> Result<std::ops::Range<usize>> {
        let (first, last) = (self.decoder_first_pipeline_num_layers, self.decoder_last_pipeline_num_layers);
        megatron_transformer::pipeline_split::stage_range(self.num_layers, pp, stage, first, last)
    }

    pub fn transformer_config(&self) -> TransformerConfig {
        TransformerConfig {
            num_layers: self.num_layers,
            hidden_size: self.hidden_size,
            num_attention_heads: self.num_attention_heads,
            ffn_hidden_size: self.ffn(),
            layernorm_epsilon: self.layernorm_epsilon,
            hidden_dropout: self.hidden_dropout,
            attention_dropout: self.attention_dropout,
            init_method_std: self.init_method_std,
            ..Default::default()
        }
    }
}
