//! `megatron pretrain --model bert`: Megatron's BERT flags (`pretrain_bert.py`, SPEC §4.8,
//! §2.11), their checks, and the `bert` model and dataset plugin configs built from them.
//! The model is Megatron-Core's pre-LN BERT with `num_tokentypes = 2` when the binary head is
//! on (0 without, as `pretrain_bert.py`); the data is one sentence-split `--data-path`
//! prefix read with the BERT WordPiece `--vocab-file`.

use crate::args::PretrainArgs;
use clap::Args;
use serde::Serialize;
use serde_json::{json, Value};

#[derive(Args, Clone, Debug, Serialize)]
pub struct BertArgs {
    /// BERT: no sentence-order (binary) head; samples are not split into swapped segments.
    #[arg(long = "bert-no-binary-head", action = clap::ArgAction::SetFalse)]
    pub bert_binary_head: bool,
    /// BERT: the sentence-order head (the default; accepted for symmetry).
    #[arg(long = "bert-binary-head", conflicts_with = "bert_binary_head")]
    #[serde(skip)]
    pub bert_binary_head_on: bool,
    /// BERT/T5 masked-LM: probability of masking a token.
    #[arg(long, default_value_t = 0.15)]
    pub mask_prob: f64,
    /// BERT/T5 masked-LM: probability of a sample shorter than the maximum length.
    #[arg(long, default_value_t = 0.1)]
    pub short_seq_prob: f64,
    /// BERT (megatron-rs): post-LN layers with an embedding LayerNorm, as the original BERT
    /// and Hugging Face checkpoints (default: Megatron-Core's pre-LN layers).
    #[arg(long)]
    pub bert_post_ln: bool,
    /// BERT (megatron-rs): the exact erf GeLU (Hugging Face `hidden_act = "gelu"`) instead of
    /// Megatron's tanh approximation.
    #[arg(long)]
    pub bert_gelu_erf: bool,
}

impl Default for BertArgs {
    fn default() -> Self {
        BertArgs {
            bert_binary_head: true,
            bert_binary_head_on: false,
            mask_prob: 0.15,
            short_seq_prob: 0.1,
            bert_post_ln: false,
            bert_gelu_erf: false,
        }
    }
}

/// What `--model bert` needs of the other flags (empty when all is well).
pub fn check(a: &PretrainArgs, tokenizer_type: Option<&str>) -> Vec<String> {
    let mut errors = Vec::new();
    if a.mock_data || a.data_path.len() != 1 {
        errors.push(
            "--model bert reads one sentence-split --data-path PREFIX (`megatron preprocess --split-sentences`); \
             --mock-data, blends and per-split paths are not supported for BERT"
                .to_string(),
        );
    }
    if !matches!(tokenizer_type, Some("BertWordPieceLowerCase" | "BertWordPieceCase"))
        || a.tokenizer.vocab_file.is_none()
    {
        errors.push(
            "--model bert needs --tokenizer-type BertWordPieceLowerCase (or BertWordPieceCase) and --vocab-file vocab.txt"
                .to_string(),
        );
    }
    if a.context_parallel_size > 1 || a.sequence_parallel {
        errors.push(
            "--model bert runs with tensor, pipeline and data parallelism: use --context-parallel-size 1 and no \
             --sequence-parallel"
                .to_string(),
        );
    }
    let pp = a.pipeline_model_parallel_size.max(1);
    // Even, or Megatron's uneven split with --decoder-first/last-pipeline-num-layers.
    let (first, last) = (a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers);
    if let Err(e) = megatron_transformer::pipeline_split::pipeline_split(a.num_layers, pp, first, last) {
        errors.push(format!("--model bert: {e}"));
    }
    if a.swiglu || a.normalization != "LayerNorm" || a.position_embedding_type != "learned_absolute" {
        errors.push(
            "--model bert is Megatron's BERT: LayerNorm, GeLU and learned absolute positions (drop --swiglu, \
             --normalization and --position-embedding-type)"
                .to_string(),
        );
    }
    let mask_ok = a.bert.mask_prob > 0.0 && a.bert.mask_prob < 1.0;
    if !(mask_ok && (0.0..=1.0).contains(&a.bert.short_seq_prob)) {
        errors.push(format!(
            "--mask-prob {} must be in (0, 1) and --short-seq-prob {} in [0, 1]",
            a.bert.mask_prob, a.bert.short_seq_prob
        ));
    }
    errors
}

/// The `bert` model plugin config.
pub fn model_config(a: &PretrainArgs, max_position_embeddings: usize, vocab_size: usize) -> Value {
    let binary = a.bert.bert_binary_head;
    let mut c = json!({
        "num_layers": a.num_layers,
        "hidden_size": a.hidden_size,
        "num_attention_heads": a.num_attention_heads,
        "ffn_hidden_size": a.ffn_hidden_size,
        "max_position_embeddings": max_position_embeddings,
        "vocab_size": vocab_size,
        "make_vocab_size_divisible_by": a.make_vocab_size_divisible_by,
        "num_tokentypes": if binary { 2 } else { 0 },
        "bert_binary_head": binary,
        "layernorm_epsilon": a.norm_epsilon,
        "hidden_dropout": a.hidden_dropout,
        "attention_dropout": a.attention_dropout,
        "init_method_std": a.init_method_std,
        "seed": a.seed,
        "seq_length": a.seq_length,
        "layernorm": if a.bert.bert_post_ln { "post" } else { "pre" },
        "gelu_erf": a.bert.bert_gelu_erf,
        "decoder_first_pipeline_num_layers": a.decoder_first_pipeline_num_layers,
        "decoder_last_pipeline_num_layers": a.decoder_last_pipeline_num_layers,
    });
    // Mixed precision only when asked (SPEC §6.7, docs/mixed_precision.md).
    let dtype = if a.bf16 {
        Some("bf16")
    } else if a.fp16 {
        Some("f16")
    } else {
        None
    };
    if let (Some(d), Some(m)) = (dtype, c.as_object_mut()) {
        m.insert("params_dtype".into(), json!(d));
    }
    // Full recomputation over each stage's encoder layers (SPEC §6.9).
    if let (Some("full"), Some(m)) = (a.recompute_granularity.as_deref(), c.as_object_mut()) {
        let method = a.recompute_method.clone().unwrap_or_default();
        m.insert("recompute".into(), json!({"method": method, "num_layers": a.recompute_num_layers.unwrap_or(1)}));
    }
    c
}

/// The `bert` dataset plugin config.
pub fn dataset_config(a: &PretrainArgs, num_samples: [u64; 3]) -> Value {
    json!({
        "data_path": a.data_path,
        "split": a.split.clone().unwrap_or_else(|| "969, 30, 1".to_string()),
        "vocab_file": a.tokenizer.vocab_file,
        "seq_length": a.seq_length,
        "seed": a.seed,
        "mask_prob": a.bert.mask_prob,
        "short_seq_prob": a.bert.short_seq_prob,
        "binary_head": a.bert.bert_binary_head,
        "num_samples": num_samples,
    })
}
