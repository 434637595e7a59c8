//! `megatron pretrain` flags, with Megatron-LM's names and defaults (SPEC §11).
//!
//! Flags Megatron has but megatron-rs does not implement yet are either absent (clap reports
//! them as unknown) or accepted and rejected in [`crate::config`] with a message saying so.

use clap::Args;
use serde::Serialize;
use std::path::PathBuf;

#[derive(Args, Clone, Debug, Serialize)]
pub struct PretrainArgs {
    // ---- model (SPEC §11.1) ------------------------------------------------------------
    /// Registered model plugin to train.
    #[arg(long, default_value = "gpt")]
    pub model: String,
    #[arg(long)]
    pub num_layers: usize,
    #[arg(long)]
    pub hidden_size: usize,
    #[arg(long)]
    pub ffn_hidden_size: Option<usize>,
    #[arg(long)]
    pub num_attention_heads: usize,
    #[arg(long)]
    pub seq_length: usize,
    #[arg(long)]
    pub max_position_embeddings: Option<usize>,
    #[arg(long, default_value_t = 128)]
    pub make_vocab_size_divisible_by: usize,
    #[arg(long, default_value = "LayerNorm")]
    pub normalization: String,
    #[arg(long, default_value_t = 1e-5)]
    pub norm_epsilon: f32,
    #[arg(long, default_value = "learned_absolute")]
    pub position_embedding_type: String,
    #[arg(long)]
    pub swiglu: bool,
    #[arg(long)]
    pub untie_embeddings_and_output_weights: bool,
    /// Rotary base (theta) with `--position-embedding-type rope`.
    #[arg(long, default_value_t = 10000.0)]
    pub rotary_base: f32,
    /// Fraction of each head's channels that rotate.
    #[arg(long, default_value_t = 1.0)]
    pub rotary_percent: f32,
    /// Rotate adjacent channel pairs instead of the two halves.
    #[arg(long)]
    pub rotary_interleaved: bool,
    /// Grouped-query attention with `--num-query-groups` key/value groups.
    #[arg(long)]
    pub group_query_attention: bool,
    #[arg(long, default_value_t = 1)]
    pub num_query_groups: usize,
    /// Per-head size (default `--hidden-size / --num-attention-heads`).
    #[arg(long)]
    pub kv_channels: Option<usize>,
    /// No biases on the linear layers (Llama).
    #[arg(long)]
    pub disable_bias_linear: bool,
    /// A bias on the fused QKV projection even with `--disable-bias-linear` (Qwen2).
    #[arg(long)]
    pub add_qkv_bias: bool,
    #[arg(long, default_value_t = 0.02)]
    pub init_method_std: f32,
    #[arg(long, default_value_t = 0.1)]
    pub hidden_dropout: f32,
    #[arg(long, default_value_t = 0.1)]
    pub attention_dropout: f32,

    // ---- optimizer (SPEC §11.2) ---------------------------------------------------------
    #[arg(long, default_value = "adam")]
    pub optimizer: String,
    #[arg(long, default_value_t = 0.01)]
    pub weight_decay: f64,
    #[arg(long)]
    pub start_weight_decay: Option<f64>,
    #[arg(long)]
    pub end_weight_decay: Option<f64>,
    #[arg(long, default_value = "constant")]
    pub weight_decay_incr_style: String,
    #[arg(long, default_value_t = 1.0)]
    pub clip_grad: f64,
    #[arg(long, default_value_t = 0.9)]
    pub adam_beta1: f64,
    #[arg(long, default_value_t = 0.999)]
    pub adam_beta2: f64,
    #[arg(long, default_value_t = 1e-8)]
    pub adam_eps: f64,
    #[arg(long, default_value_t = 0.9)]
    pub sgd_momentum: f64,

    // ---- training (SPEC §11.3) ----------------------------------------------------------
    #[arg(long)]
    pub micro_batch_size: usize,
    #[arg(long)]
    pub global_batch_size: Option<usize>,
    #[arg(long)]
    pub train_iters: u64,
    #[arg(long, default_value_t = 100)]
    pub log_interval: u64,
    #[arg(long)]
    pub exit_interval: Option<u64>,
    #[arg(long)]
    pub exit_duration_in_mins: Option<f64>,
    #[arg(long, default_value_t = 1234)]
    pub seed: u64,

    // ---- learning rate (SPEC §11.4) -----------------------------------------------------
    #[arg(long)]
    pub lr: f64,
    #[arg(long, default_value_t = 0.0)]
    pub min_lr: f64,
    #[arg(long, default_value = "linear")]
    pub lr_decay_style: String,
    #[arg(long)]
    pub lr_decay_iters: Option<u64>,
    #[arg(long)]
    pub lr_warmup_fraction: Option<f64>,
    #[arg(long, default_value_t = 0)]
    pub lr_warmup_iters: u64,
    #[arg(long, default_value_t = 0.0)]
    pub lr_warmup_init: f64,
    #[arg(long, default_value = "exponential")]
    pub lr_wsd_decay_style: String,
    #[arg(long)]
    pub lr_wsd_decay_iters: Option<u64>,
    #[arg(long = "override-opt_param-scheduler", alias = "override-opt-param-scheduler")]
    pub override_opt_param_scheduler: bool,
    #[arg(long = "use-checkpoint-opt_param-scheduler", alias = "use-checkpoint-opt-param-scheduler")]
    pub use_checkpoint_opt_param_scheduler: bool,

    // ---- checkpointing (SPEC §11.5) -----------------------------------------------------
    #[arg(long)]
    pub save: Option<PathBuf>,
    #[arg(long)]
    pub load: Option<PathBuf>,
    #[arg(long, alias = "persistent-save-interval")]
    pub save_interval: Option<u64>,
    #[arg(long)]
    pub no_save_optim: bool,
    #[arg(long)]
    pub no_save_rng: bool,
    #[arg(long)]
    pub no_load_optim: bool,
    #[arg(long)]
    pub no_load_rng: bool,
    #[arg(long)]
    pub finetune: bool,
    #[arg(long)]
    pub exit_on_missing_checkpoint: bool,

    // ---- parallelism (SPEC §11.7) -------------------------------------------------------
    #[arg(long, default_value_t = 1)]
    pub tensor_model_parallel_size: usize,
    #[arg(long, default_value_t = 1)]
    pub pipeline_model_parallel_size: usize,
    /// Decoder layers of the first pipeline stage; the rest split evenly over the others.
    #[arg(long)]
    pub decoder_first_pipeline_num_layers: Option<usize>,
    /// Decoder layers of the last pipeline stage (the LM head and loss live there too).
    #[arg(long)]
    pub decoder_last_pipeline_num_layers: Option<usize>,
    /// Ranks to run as threads of this process (`local` communicator); dp = N / (tp x pp).
    #[arg(long, visible_alias = "world-size", default_value_t = 1)]
    pub nproc: usize,
    /// All-reduce each gradient bucket as soon as its gradients are final in the last
    /// microbatch's backward, overlapped with the rest of backward.
    #[arg(long)]
    pub overlap_grad_reduce: bool,
    /// Gradient bucket size in elements (default with overlap: max(4e7, 1e6 x dp)).
    #[arg(long)]
    pub ddp_bucket_size: Option<usize>,
    /// How long a rank waits for its peers in a collective before failing.
    #[arg(long, default_value_t = 10)]
    pub distributed_timeout_minutes: u64,
    /// 1 or more: with `--nproc`, each rank prints where its training time went (compute vs
    /// time inside each communicator call per group) when training ends.
    #[arg(long, default_value_t = 0)]
    pub timing_log_level: u32,

    // ---- data and tokenizer (SPEC §11.8) ------------------------------------------------
    #[arg(long, num_args = 1..)]
    pub data_path: Vec<String>,
    #[arg(long)]
    pub split: Option<String>,
    #[arg(long)]
    pub mock_data: bool,
    #[arg(long)]
    pub data_cache_path: Option<PathBuf>,
    /// Per-split data, each a blend like --data-path (instead of --data-path and --split).
    #[arg(long, num_args = 1..)]
    pub train_data_path: Vec<String>,
    #[arg(long, num_args = 1..)]
    pub valid_data_path: Vec<String>,
    #[arg(long, num_args = 1..)]
    pub test_data_path: Vec<String>,
    /// Extra fraction of samples each dataset of a weighted blend builds.
    #[arg(long, default_value_t = 0.005)]
    pub mid_level_dataset_surplus: f64,
    /// Accepted for compatibility; the .bin file is always memory-mapped.
    #[arg(long)]
    pub no_mmap_bin_files: bool,
    #[arg(long)]
    pub tokenizer_type: Option<String>,
    #[arg(long)]
    pub vocab_file: Option<PathBuf>,
    #[arg(long)]
    pub merge_file: Option<PathBuf>,
    /// `tokenizer.json` of `--tokenizer-type HuggingFaceTokenizer`.
    #[arg(long)]
    pub tokenizer_model: Option<PathBuf>,
    /// Extra `<extra_id_i>` tokens of the BERT WordPiece tokenizers.
    #[arg(long)]
    pub vocab_extra_ids: Option<usize>,
    /// Vocabulary size for `--mock-data` / `NullTokenizer`.
    #[arg(long)]
    pub vocab_size: Option<usize>,

    // ---- validation and logging (SPEC §11.9) --------------------------------------------
    #[arg(long, default_value_t = 1000)]
    pub eval_interval: u64,
    #[arg(long, default_value_t = 100)]
    pub eval_iters: u64,
    #[arg(long)]
    pub tensorboard_dir: Option<PathBuf>,
    /// Appends every logged scalar as one JSON line to this file (megatron-rs).
    #[arg(long)]
    pub metrics_jsonl: Option<PathBuf>,
    /// Megatron prints TFLOP/s only with this flag; megatron-rs always prints it.
    #[arg(long)]
    pub log_throughput: bool,

    // ---- megatron-rs specific -----------------------------------------------------------
    /// Compute backend plugin (`megatron list --kind backend`).
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// Worker threads of the CPU backend (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Floating-point type of parameters and activations. Only fp32 trains today.
    #[arg(long)]
    pub bf16: bool,
    #[arg(long)]
    pub fp16: bool,
    /// Plugin configurations from a JSON, TOML or YAML file, one section per plugin kind
    /// (`model: {name: gpt, ...}`); the file wins over flags (docs/plugins.md).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}
