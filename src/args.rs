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
    /// Pad the vocabulary to a multiple of N × tp (Megatron's rule: GPT-2's 50257 becomes
    /// 50304 at tp 1, 50432 at tp 2). The padded rows are masked out of the softmax, so the
    /// losses do not depend on the padding. Example: `--vocab-size 50257
    /// --make-vocab-size-divisible-by 128 --nproc 2 --tensor-model-parallel-size 2`.
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
    /// Megatron's flag for bit-reproducible runs. Accepted for compatibility: CPU runs are
    /// always deterministic (reductions add fixed-size pieces in index order, whatever the
    /// thread count or machine load; same losses and grad norms for any --threads).
    #[arg(long)]
    pub deterministic_mode: bool,

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
    /// Interleaved 1F1B (SPEC §5.5): decoder layers per model chunk; each pipeline rank holds
    /// (num-layers / pp) / N chunks (virtual stages), which shrinks the pipeline bubble to
    /// (pp-1)/(chunks x microbatches). Example: `--nproc 2 --pipeline-model-parallel-size 2
    /// --num-layers 4 --num-layers-per-virtual-pipeline-stage 1 --global-batch-size 8`.
    #[arg(long)]
    pub num_layers_per_virtual_pipeline_stage: Option<usize>,
    /// Interleaved 1F1B: model chunks per pipeline rank (instead of giving the layers per chunk).
    #[arg(long, visible_alias = "virtual-pipeline-model-parallel-size")]
    pub num_virtual_stages_per_pipeline_rank: Option<usize>,
    /// Interleaved 1F1B: microbatches run through one chunk before the next (default: pp).
    #[arg(long)]
    pub microbatch_group_size_per_virtual_pipeline_stage: Option<usize>,
    /// Sequence parallelism (SPEC §5.3, needs --tensor-model-parallel-size > 1): norms,
    /// dropouts and residuals keep only this rank's 1/tp of the tokens; the TP all-reduces
    /// become all-gather / reduce-scatter pairs. Same losses, less activation memory. Works in
    /// fp32, --bf16 and --fp16 (the collectives move the model's dtype). Example:
    /// `--nproc 2 --tensor-model-parallel-size 2 --sequence-parallel --bf16`.
    #[arg(long)]
    pub sequence_parallel: bool,
    /// Context parallelism (SPEC §5.9): each sequence is cut into 2 x cp chunks, CP rank r keeps
    /// chunks r and 2cp-1-r (causal load balance) and the attention runs as a ring exchanging
    /// K/V blocks; dp = nproc / (tp x cp x pp). Needs --seq-length divisible by 2 x cp and
    /// --attention-dropout 0. Works with --bf16/--fp16 (K/V blocks travel in the half type, the
    /// partial outputs merge in fp32). Example: `--nproc 2 --context-parallel-size 2 --attention-dropout 0`.
    #[arg(long, default_value_t = 1)]
    pub context_parallel_size: usize,
    /// Ranks to run as threads of this process (`local` communicator); dp = N / (tp x cp x pp).
    #[arg(long, visible_alias = "world-size", default_value_t = 1)]
    pub nproc: usize,
    /// Where the ranks come from: `local` (threads of this process, `--nproc`), `mpi` (one
    /// process per rank, started by mpirun/srun; a `--features mpi` build) or `auto` (mpi when
    /// an MPI launcher started this process, else local). See docs/mpi.md.
    #[arg(long, default_value = "auto", value_parser = ["auto", "mpi", "local"])]
    pub distributed_backend: String,
    /// All-reduce each gradient bucket as soon as its gradients are final in the last
    /// microbatch's backward, overlapped with the rest of backward.
    #[arg(long)]
    pub overlap_grad_reduce: bool,
    /// Gradient bucket size in elements (default with overlap: max(4e7, 1e6 x dp)).
    #[arg(long)]
    pub ddp_bucket_size: Option<usize>,
    /// ZeRO-1 (SPEC §5.7): gradients reduce-scattered over data parallel, Adam state and fp32
    /// main params kept only for this rank's shard (also with --bf16/--fp16: the shard is
    /// rounded on its owner and all-gathered in the half dtype), updated params all-gathered. Example:
    /// `--nproc 4 --use-distributed-optimizer --overlap-grad-reduce`.
    #[arg(long)]
    pub use_distributed_optimizer: bool,
    /// Overlap the distributed optimizer's parameter all-gather with the next forward: the step
    /// only starts the per-bucket all-gathers, and each layer's forward waits for the bucket(s)
    /// of its own parameters (fp32, --bf16 or --fp16). Needs
    /// --use-distributed-optimizer. Example:
    /// `--nproc 2 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather`.
    #[arg(long)]
    pub overlap_param_gather: bool,
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
    /// The tokenizer flags (src/tokenizer_flags.rs); flat in the stored args as before.
    #[command(flatten)]
    #[serde(flatten)]
    pub tokenizer: crate::tokenizer_flags::TokenizerArgs,
    /// The T5 flags (`--model t5`, src/t5_args.rs).
    #[command(flatten)]
    #[serde(flatten)]
    pub t5: crate::t5_args::T5Args,
    /// Mixture of Experts (src/moe_args.rs).
    #[command(flatten)]
    #[serde(flatten)]
    pub moe: crate::moe_args::MoeArgs,
    /// Mamba / hybrid models (`--model hybrid|mamba`, src/hybrid_args.rs).
    #[command(flatten)]
    #[serde(flatten)]
    pub hybrid: crate::hybrid_args::HybridArgs,
    /// The BERT flags (`--model bert`, src/bert_args.rs).
    #[command(flatten)]
    #[serde(flatten)]
    pub bert: crate::bert_args::BertArgs,
    /// Llama-family flags added later: rope scaling, `--qk-layernorm` (src/llama_args.rs).
    #[command(flatten)]
    #[serde(flatten)]
    pub llama: crate::llama_args::LlamaArgs,

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
    /// Megatron prints TFLOP/s only with this flag; megatron-rs always prints it. TensorBoard
    /// gets `throughput` only with it and --log-timers-to-tensorboard (as Megatron).
    #[arg(long)]
    pub log_throughput: bool,
    /// Write TensorBoard scalars every N iterations.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub tensorboard_log_interval: u64,
    /// Write `iteration-time` (and `throughput` with --log-throughput, `tokens-per-second`)
    /// to TensorBoard.
    #[arg(long)]
    pub log_timers_to_tensorboard: bool,
    /// Do not write `loss-scale` to TensorBoard (Megatron writes it by default).
    #[arg(long = "no-log-loss-scale-to-tensorboard", alias = "disable-log-loss-scale-to-tensorboard",
          action = clap::ArgAction::SetFalse)]
    pub log_loss_scale_to_tensorboard: bool,
    /// Write `lm loss validation ppl` to TensorBoard.
    #[arg(long)]
    pub log_validation_ppl_to_tensorboard: bool,
    /// Write `world-size` to TensorBoard.
    #[arg(long)]
    pub log_world_size_to_tensorboard: bool,

    // ---- megatron-rs specific -----------------------------------------------------------
    /// Compute backend plugin (`megatron list --kind backend`).
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// Worker threads of the CPU backend (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// bf16 parameters and activations, fp32 main parameters and Adam state in the optimizer,
    /// fp32 gradients (SPEC §6.7, docs/mixed_precision.md).
    #[arg(long)]
    pub bf16: bool,
    /// fp16 parameters and activations with loss scaling (dynamic unless --loss-scale).
    #[arg(long)]
    pub fp16: bool,
    /// A constant loss scale (fp16/bf16); without it fp16 scales dynamically (SPEC §6.7).
    #[arg(long)]
    pub loss_scale: Option<f64>,
    /// Dynamic loss scaling: the starting scale (2^32).
    #[arg(long, default_value_t = 4294967296.0)]
    pub initial_loss_scale: f64,
    /// Dynamic loss scaling: the scale never backs off below this.
    #[arg(long, default_value_t = 1.0)]
    pub min_loss_scale: f64,
    /// Dynamic loss scaling: clean iterations before the scale doubles.
    #[arg(long, default_value_t = 1000)]
    pub loss_scale_window: u64,
    /// Dynamic loss scaling: overflows tolerated before the scale halves.
    #[arg(long, default_value_t = 2)]
    pub hysteresis: u64,
    /// Same as `--recompute-granularity selective` (SPEC §6.9).
    #[arg(long)]
    pub recompute_activations: bool,
    /// `selective` (the modules of `--recompute-modules`) or `full` (whole layers, `--recompute-method`).
    #[arg(long)]
    pub recompute_granularity: Option<String>,
    /// Modules recomputed by selective recomputation; only `core_attn`, which our attention
    /// always recomputes (docs in config.rs).
    #[arg(long, num_args = 1..)]
    pub recompute_modules: Vec<String>,
    /// Full recomputation: `uniform` (units of `--recompute-num-layers`) or `block` (the first
    /// `--recompute-num-layers` layers of each pipeline stage).
    #[arg(long)]
    pub recompute_method: Option<String>,
    /// Full recomputation: layers per unit (`uniform`) or per stage (`block`); default 1.
    #[arg(long)]
    pub recompute_num_layers: Option<usize>,
    /// Plugin configurations from a JSON, TOML or YAML file, one section per plugin kind
    /// (`model: {name: gpt, ...}`); the file wins over flags (docs/plugins.md).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Start even when the memory estimate (parameters, gradients, optimizer state,
    /// activations) exceeds this machine's memory or cgroup limit.
    #[arg(long)]
    pub skip_memory_check: bool,
    /// Gradients accumulated and data-parallel-reduced in fp32: always so for --bf16/--fp16
    /// here (accepted for compatibility; see docs/mixed_precision.md).
    #[arg(long)]
    pub accumulate_allreduce_grads_in_fp32: bool,
    /// With --bf16: bf16 gradient buffers instead of fp32 ones, reduced (all-reduce, or reduce-scatter
    /// with --use-distributed-optimizer) over data parallel in bf16.
    #[arg(long)]
    pub grad_reduce_in_bf16: bool,
    /// Accepted: our attention always computes its softmax in fp32 from half inputs.
    #[arg(long)]
    pub attention_softmax_in_fp32: bool,
    /// Keep the residual stream in fp32 in a --bf16/--fp16 model.
    #[arg(long)]
    pub fp32_residual_connection: bool,
    /// On a non-finite loss or gradient (the update is skipped and diagnosed: first bad
    /// parameter, microbatch, samples): `skip` goes on, `stop` ends the run, `rewind` reloads
    /// the last checkpoint and skips the offending global batch from then on (src/train/guards.rs).
    #[arg(long, default_value = "skip", value_parser = ["skip", "stop", "rewind"])]
    pub on_nan: String,
    /// Print every layer's gradient norm at each log interval.
    #[arg(long)]
    pub log_per_layer_grad_norms: bool,
    /// Tests only: a NaN in PARAM's gradient at iteration ITER (and in the replay of MB).
    #[arg(long, hide = true, value_name = "ITER:MB:PARAM")]
    pub inject_nan_grad: Option<String>,
    /// Loss spike detector: an iteration whose loss is more than Z standard deviations above
    /// what the last --spike-window healthy iterations predict (--spike-score) is handled by
    /// --on-spike.
    #[arg(long, value_name = "Z")]
    pub spike_threshold: Option<f64>,
    /// The same detector on the gradient norm.
    #[arg(long, value_name = "Z")]
    pub grad_norm_spike_threshold: Option<f64>,
    /// Healthy iterations the spike detectors remember (they judge from half of it on).
    #[arg(long, default_value_t = 20)]
    pub spike_window: usize,
    /// On a spike (the update is not applied): `skip` goes on, `stop` ends the run, `rewind`
    /// reloads the last checkpoint and skips the offending global batch (src/train/rewind.rs).
    #[arg(long, default_value = "skip", value_parser = ["skip", "stop", "rewind"])]
    pub on_spike: String,
    /// Training samples never trained on: a global batch holding one of them is consumed
    /// without an update (Megatron's --iterations-to-skip, by sample). A rewind adds the
    /// offending batch; the list is stored in checkpoints and merged on load.
    #[arg(long, num_args = 1.., value_name = "SAMPLE")]
    pub skip_train_samples: Vec<u64>,
    /// How the spike detectors score an iteration: `trend` (residual from a robust linear
    /// trend of the window, so a steep loss descent does not hide a jump) or `mean` (plain
    /// z-score against the window's mean and standard deviation).
    #[arg(long, default_value = "trend", value_parser = ["trend", "mean"])]
    pub spike_score: String,
    /// Measurements only (scripts/interleaved_bubble.sh): every pipeline rank also sleeps MS
    /// milliseconds per microbatch forward and 2·MS per backward, split evenly over its model
    /// chunks, so equal stages dominate the real compute without needing a core each.
    #[arg(long, hide = true, value_name = "MS")]
    pub pipeline_probe_compute_ms: Option<f64>,
}
