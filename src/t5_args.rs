//! `megatron pretrain --model t5`: Megatron's T5 flags (`pretrain_t5.py`, SPEC §4.9) and the
//! `t5` model and dataset plugin configs built from them. `--seq-length` is the encoder
//! length as in Megatron (`--encoder-seq-length` overrides it); `--num-layers` gives both
//! stacks unless `--encoder-num-layers` / `--decoder-num-layers` are set.

use crate::args::PretrainArgs;
use clap::Args;
use serde::Serialize;
use serde_json::{json, Value};

#[derive(Args, Clone, Debug, Default, Serialize)]
pub struct T5Args {
    /// T5: encoder layers (default `--num-layers`).
    #[arg(long)]
    pub encoder_num_layers: Option<usize>,
    /// T5: decoder layers (default `--num-layers`).
    #[arg(long)]
    pub decoder_num_layers: Option<usize>,
    /// T5: encoder sequence length (default `--seq-length`).
    #[arg(long)]
    pub encoder_seq_length: Option<usize>,
    /// T5: decoder sequence length.
    #[arg(long, default_value_t = 128)]
    pub decoder_seq_length: usize,
    /// T5 with `--position-embedding-type relative`: buckets of the relative position bias.
    #[arg(long, default_value_t = 32)]
    pub relative_attention_num_buckets: usize,
    /// T5 with `--position-embedding-type relative`: distance of the last bucket.
    #[arg(long, default_value_t = 128)]
    pub relative_attention_max_distance: usize,
}

impl T5Args {
    pub fn encoder_seq_length(&self, a: &PretrainArgs) -> usize {
        self.encoder_seq_length.unwrap_or(a.seq_length)
    }
}

/// The `t5` model plugin config.
pub fn model_config(a: &PretrainArgs, max_position_embeddings: usize, vocab_size: usize) -> Value {
    let t = &a.t5;
    let (enc, dec) = (t.encoder_seq_length(a), t.decoder_seq_length);
    let mut c = json!({
        "encoder_num_layers": t.encoder_num_layers.unwrap_or(a.num_layers),
        "decoder_num_layers": t.decoder_num_layers.unwrap_or(a.num_layers),
        "hidden_size": a.hidden_size,
        "num_attention_heads": a.num_attention_heads,
        "kv_channels": a.kv_channels,
        "ffn_hidden_size": a.ffn_hidden_size,
        "encoder_seq_length": enc,
        "decoder_seq_length": dec,
        "max_position_embeddings": max_position_embeddings.max(enc).max(dec),
        "vocab_size": vocab_size,
        "make_vocab_size_divisible_by": a.make_vocab_size_divisible_by,
        "init_method_std": a.init_method_std,
        "hidden_dropout": a.hidden_dropout,
        "attention_dropout": a.attention_dropout,
        "layernorm_epsilon": a.norm_epsilon,
        "seed": a.seed,
        "normalization": a.normalization,
        "position_embedding_type": a.position_embedding_type,
        "relative_attention_num_buckets": t.relative_attention_num_buckets,
        "relative_attention_max_distance": t.relative_attention_max_distance,
        "add_bias_linear": !a.disable_bias_linear,
    });
    if c["kv_channels"].is_null() {
        c.as_object_mut().map(|m| m.remove("kv_channels"));
    }
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
    // Full recomputation over each stack's layers (SPEC §6.9, models/t5/src/recompute.rs).
    if let (Some("full"), Some(m)) = (a.recompute_granularity.as_deref(), c.as_object_mut()) {
        let method = a.recompute_method.clone().unwrap_or_default();
        m.insert("recompute".into(), json!({"method": method, "num_layers": a.recompute_num_layers.unwrap_or(1)}));
    }
    c
}

/// The `t5` dataset plugin config.
pub fn dataset_config(a: &PretrainArgs, num_samples: [u64; 3]) -> Value {
    json!({
        "data_path": a.data_path,
        "split": a.split.clone().unwrap_or_else(|| "969, 30, 1".to_string()),
        "vocab_file": a.tokenizer.vocab_file,
        "vocab_extra_ids": a.tokenizer.vocab_extra_ids.unwrap_or(0),
        "encoder_seq_length": a.t5.encoder_seq_length(a),
        "decoder_seq_length": a.t5.decoder_seq_length,
        "seed": a.seed,
        "num_samples": num_samples,
    })
}
