//! Turns `megatron pretrain` flags into one validated [`TrainConfig`] and the JSON configs of
//! the plugins it builds. Every problem is collected and reported at once (ARCHITECTURE.md
//! "Data flow" step 1); nothing is silently adjusted.

use crate::args::PretrainArgs;
use anyhow::{bail, Result};
use serde_json::{json, Value};

/// Values derived from the flags (SPEC §6.1, §3.2, §2.3).
#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub args: PretrainArgs,
    pub world_size: usize,
    pub data_parallel_size: usize,
    pub global_batch_size: usize,
    pub num_microbatches: usize,
    pub max_position_embeddings: usize,
    pub tokenizer_type: Option<String>,
    /// Requested samples per split: train, valid, test (SPEC §2.3).
    pub split_samples: [u64; 3],
}

impl TrainConfig {
    pub fn from_args(args: &PretrainArgs, world_size: usize) -> Result<TrainConfig> {
        let a = args;
        let mut errors: Vec<String> = Vec::new();
        let mut need = |ok: bool, msg: String| {
            if !ok {
                errors.push(msg);
            }
        };
        let tp = a.tensor_model_parallel_size.max(1);
        let pp = a.pipeline_model_parallel_size.max(1);
        let cp = a.context_parallel_size.max(1);
        need(
            a.tensor_model_parallel_size > 0 && a.pipeline_model_parallel_size > 0 && world_size > 0,
            "--tensor-model-parallel-size, --pipeline-model-parallel-size and --nproc must be >= 1".into(),
        );
        if let Err(e) = a.llama.rope_scaling() {
            need(false, e.to_string());
        }
        need(a.distributed_timeout_minutes > 0, "--distributed-timeout-minutes must be > 0".into());
        need(a.ddp_bucket_size != Some(0), "--ddp-bucket-size must be > 0".into());
        need(
            !a.overlap_param_gather || a.use_distributed_optimizer,
            "--overlap-param-gather overlaps the distributed optimizer's parameter all-gather with the next \
             forward: add --use-distributed-optimizer or drop the flag"
                .into(),
        );
        need(
            !a.use_distributed_optimizer || a.optimizer == "adam",
            format!("--use-distributed-optimizer wraps Adam; --optimizer {} is not supported with it", a.optimizer),
        );
        need(
            world_size.is_multiple_of(tp * pp * cp),
            format!(
                "--nproc {world_size} is not divisible by --tensor-model-parallel-size {tp} x \
                 --pipeline-model-parallel-size {pp} x --context-parallel-size {cp}"
            ),
        );
        need(
            pp > 1 || (a.decoder_first_pipeline_num_layers.is_none() && a.decoder_last_pipeline_num_layers.is_none()),
            "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers need \
             --pipeline-model-parallel-size >= 2; drop them"
                .into(),
        );
        need(
            !a.sequence_parallel || tp > 1,
            "--sequence-parallel shards the tensor-parallel group's activations; it needs \
             --tensor-model-parallel-size >= 2 (drop the flag at tp = 1)"
                .into(),
        );
        need(
            !a.sequence_parallel || a.seq_length.is_multiple_of(tp),
            format!(
                "--sequence-parallel splits the sequence over the tensor-parallel ranks: --seq-length {} must \
                 be divisible by --tensor-model-parallel-size {tp}",
                a.seq_length
            ),
        );
        need(a.context_parallel_size > 0, "--context-parallel-size must be >= 1".into());
        need(
            cp == 1 || a.seq_length.is_multiple_of(2 * cp),
            format!(
                "--context-parallel-size {cp} cuts each sequence into 2 x {cp} chunks: --seq-length {} must be \
                 divisible by {}",
                a.seq_length,
                2 * cp
            ),
        );
        need(
            cp == 1 || a.attention_dropout == 0.0,
            "--context-parallel-size > 1 runs the ring attention without attention dropout: pass \
             --attention-dropout 0"
                .into(),
        );
        need(
            !a.sequence_parallel || (a.seq_length / cp).is_multiple_of(tp),
            format!(
                "--sequence-parallel with --context-parallel-size {cp}: the {} local tokens per sequence must be \
                 divisible by --tensor-model-parallel-size {tp}",
                a.seq_length / cp
            ),
        );
        let dp = (world_size / (tp * pp * cp)).max(1);
        need(a.micro_batch_size > 0, "--micro-batch-size must be > 0".into());
        let gbs = a.global_batch_size.unwrap_or(a.micro_batch_size * dp);
        let per_step = a.micro_batch_size * dp;
        need(
            per_step > 0 && gbs.is_multiple_of(per_step) && gbs > 0,
            format!(
                "--global-batch-size {gbs} must be a positive multiple of --micro-batch-size {} x data-parallel size {dp}",
                a.micro_batch_size
            ),
        );
        need(a.num_layers > 0, "--num-layers must be > 0".into());
        if a.model == "hybrid" || a.model == "mamba" {
            if let Err(e) = crate::hybrid_args::pattern(a) {
                need(false, e);
            }
            need(
                !a.sequence_parallel,
                format!("--model {} does not implement --sequence-parallel yet; drop the flag", a.model),
            );
        }
        need(a.hidden_size > 0, "--hidden-size must be > 0".into());
        need(
            a.num_attention_heads > 0
                && (a.kv_channels.is_some() || a.hidden_size.is_multiple_of(a.num_attention_heads.max(1))),
            format!(
                "--hidden-size {} must be divisible by --num-attention-heads {}",
                a.hidden_size, a.num_attention_heads
            ),
        );
        need(a.seq_length > 0, "--seq-length must be > 0".into());
        need(
            a.make_vocab_size_divisible_by > 0,
            "--make-vocab-size-divisible-by must be >= 1 (Megatron's default is 128)".into(),
        );
        // Megatron requires --max-position-embeddings; we default it to --seq-length (noted in README).
        let max_pos = a.max_position_embeddings.unwrap_or(a.seq_length);
        need(
            max_pos >= a.seq_length,
            format!("--max-position-embeddings {max_pos} must be >= --seq-length {}", a.seq_length),
        );
        need(a.train_iters > 0, "--train-iters must be > 0".into());
        need(a.lr >= 0.0, "--lr must be >= 0".into());
        // The scaler flags are checked now, so a bad combination is reported with the others.
        #[cfg(feature = "optim")]
        {
            if let Err(e) = megatron_optim::LossScaler::from_flags(&loss_scale_flags(a)) {
                need(false, e.to_string());
            }
        }
        // Recomputation (SPEC §6.9). Selective recomputation of `core_attn` is what our
        // attention always does: its forward keeps only qkv (B, T, 3C), the context (B, T, C) and
        // the log-sum-exp (B, heads, T); the (B, heads, T, T) scores, probabilities and attention
        // dropout mask (a pure function of the seed) are rebuilt in backward. So `selective` with
        // `core_attn` is accepted and changes nothing; other modules are not built yet. `full`
        // recomputes whole layers (megatron_transformer::recompute).
        let granularity = a.recompute_granularity.clone().or(a.recompute_activations.then(|| "selective".to_string()));
        match granularity.as_deref() {
            None => need(
                a.recompute_modules.is_empty() && a.recompute_method.is_none() && a.recompute_num_layers.is_none(),
                "--recompute-modules/--recompute-method/--recompute-num-layers need --recompute-granularity".into(),
            ),
            Some("selective") => {
                need(
                    a.recompute_modules.iter().all(|m| m == "core_attn"),
                    format!(
                        "--recompute-modules {:?}: only core_attn is available (our attention always \
                         recomputes its scores in backward); drop the others",
                        a.recompute_modules
                    ),
                );
                need(
                    a.recompute_method.is_none() && a.recompute_num_layers.is_none(),
                    "--recompute-method/--recompute-num-layers apply to --recompute-granularity full only".into(),
                );
            }
            Some("full") => {
                need(
                    matches!(a.recompute_method.as_deref(), Some("uniform" | "block")),
                    format!(
                        "--recompute-granularity full needs --recompute-method uniform or block (got {:?})",
                        a.recompute_method
                    ),
                );
                need(a.recompute_num_layers != Some(0), "--recompute-num-layers must be at least 1".into());
                // T5 and BERT recompute units of their own layer stacks
                // (models/t5/src/recompute.rs, models/bert/src/model/encode.rs).
                need(
                    ["gpt", "hybrid", "mamba", "t5", "bert"].contains(&a.model.as_str()),
                    format!(
                        "--recompute-granularity full: model `{}` does not offer it yet (gpt, hybrid, mamba, \
                         t5 and bert do); use --recompute-granularity selective or drop the flag",
                        a.model
                    ),
                );
                // MoE layers run with it: a recomputed forward counts no routing statistics
                // again (`MlpModule::set_recomputing`).
            }
            Some(other) => need(false, format!("--recompute-granularity {other}: expected selective or full")),
        }
        // Mixed precision (SPEC §6.7, docs/mixed_precision.md): half parameters and activations,
        // fp32 main parameters in the optimizer, fp32 gradients (--accumulate-allreduce-grads-in-fp32
        // is always on for half types here; fp16 gradient buffers are not offered).
        need(!a.grad_reduce_in_bf16 || a.bf16, "--grad-reduce-in-bf16 applies to --bf16 runs only; drop it".into());
        // --grad-reduce-in-bf16 at any data-parallel size, with or without the distributed
        // optimizer: the reducer all-reduces / reduce-scatters bf16 buckets in bf16 (SPEC §5.7).
        let half_models = ["gpt", "hybrid", "mamba", "t5", "bert", "swiglu-mlp-lm"];
        need(
            half_models.contains(&a.model.as_str()) || !(a.bf16 || a.fp16),
            format!(
                "--bf16/--fp16: model `{}` takes no dtype yet (gpt, hybrid, mamba, t5, bert and swiglu-mlp-lm do); \
                 train it in fp32",
                a.model
            ),
        );
        need(
            !(a.fp32_residual_connection && ["t5", "bert", "swiglu-mlp-lm"].contains(&a.model.as_str())),
            "--fp32-residual-connection: t5, bert and swiglu-mlp-lm keep their residual stream in the parameter \
             dtype; drop it"
                .into(),
        );
        need(
            !a.grad_reduce_in_bf16 || a.model == "gpt",
            format!(
                "--grad-reduce-in-bf16: model `{}` keeps fp32 gradient buffers (only gpt offers it); drop it",
                a.model
            ),
        );
        need(
            (0.0..1.0).contains(&a.hidden_dropout) && (0.0..1.0).contains(&a.attention_dropout),
            "--hidden-dropout and --attention-dropout must be in [0, 1)".into(),
        );
        need(a.log_interval > 0, "--log-interval must be > 0".into());
        need(a.eval_interval > 0, "--eval-interval must be > 0".into());
        if a.save.is_some() {
            need(
                a.save_interval.is_some_and(|s| s > 0),
                "--save needs --save-interval N (N > 0), as in Megatron-LM".into(),
            );
        }
        let per_split = [&a.train_data_path, &a.valid_data_path, &a.test_data_path].iter().any(|p| !p.is_empty());
        let sources = usize::from(a.mock_data) + usize::from(!a.data_path.is_empty()) + usize::from(per_split);
        need(
            sources == 1,
            "give exactly one data source: --data-path PREFIX, --train/valid/test-data-path, or --mock-data".into(),
        );
        need(
            !(per_split && a.split.is_some()),
            "--split applies to --data-path only; drop it with --train/valid/test-data-path".into(),
        );
        let tokenizer_type = match (&a.tokenizer.tokenizer_type, a.mock_data) {
            (Some(t), _) => Some(t.clone()),
            (None, true) => None,
            // pretrain_gpt.py's default (SPEC §3.1).
            (None, false) => Some("GPT2BPETokenizer".to_string()),
        };
        if tokenizer_type.is_none() {
            need(a.tokenizer.vocab_size.is_some(), "--mock-data without --tokenizer-type needs --vocab-size V".into());
        }
        if tokenizer_type.as_deref() == Some("GPT2BPETokenizer") {
            need(
                a.tokenizer.vocab_file.is_some() && a.tokenizer.merge_file.is_some(),
                "GPT2BPETokenizer needs --vocab-file (vocab.json) and --merge-file (merges.txt)".into(),
            );
        }
        if let Some(m) = gbs.checked_div(per_step) {
            crate::virtual_pipeline_args::check(a, m).into_iter().for_each(|e| need(false, e));
        }
        if a.model == "bert" {
            crate::bert_args::check(a, tokenizer_type.as_deref()).into_iter().for_each(|e| need(false, e));
        }
        if !errors.is_empty() {
            bail!("invalid arguments:\n  - {}", errors.join("\n  - "));
        }
        let gbs64 = gbs as u64;
        let split_samples =
            [a.train_iters * gbs64, (a.train_iters / a.eval_interval + 1) * a.eval_iters * gbs64, a.eval_iters * gbs64];
        Ok(TrainConfig {
            args: a.clone(),
            world_size,
            data_parallel_size: dp,
            global_batch_size: gbs,
            num_microbatches: gbs / per_step,
            max_position_embeddings: max_pos,
            tokenizer_type,
            split_samples,
        })
    }

    /// Config of the tokenizer plugin.
    pub fn tokenizer_config(&self) -> Value {
        let a = &self.args;
        // --vocab-size also sizes --mock-data, so it is a tokenizer field only for NullTokenizer.
        let null = self.tokenizer_type.as_deref() == Some("NullTokenizer");
        let flags = a.tokenizer.flags();
        crate::tokenizer_flags::TokenizerFlags { vocab_size: if null { flags.vocab_size } else { None }, ..flags }
            .config()
    }

    /// Config of the model plugin (the GPT model's `GptConfig`).
    pub fn model_config(&self, vocab_size: usize) -> Value {
        let a = &self.args;
        if a.model == "t5" {
            return crate::t5_args::model_config(a, self.max_position_embeddings, vocab_size);
        }
        if a.model == "hybrid" || a.model == "mamba" {
            return crate::hybrid_args::model_config(a, vocab_size);
        }
        if a.model == "bert" {
            return crate::bert_args::model_config(a, self.max_position_embeddings, vocab_size);
        }
        let mut config = json!({
            "num_layers": a.num_layers,
            "hidden_size": a.hidden_size,
            "num_attention_heads": a.num_attention_heads,
            "ffn_hidden_size": a.ffn_hidden_size,
            "seq_length": a.seq_length,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": vocab_size,
            "make_vocab_size_divisible_by": a.make_vocab_size_divisible_by,
            "init_method_std": a.init_method_std,
            "hidden_dropout": a.hidden_dropout,
            "attention_dropout": a.attention_dropout,
            "layernorm_epsilon": a.norm_epsilon,
            "seed": a.seed,
            "normalization": a.normalization,
            "swiglu": a.swiglu,
            "position_embedding_type": a.position_embedding_type,
            "untie_embeddings_and_output_weights": a.untie_embeddings_and_output_weights,
        });
        // Llama-family options only when set: other model plugins reject fields they do not know.
        if let Some(m) = config.as_object_mut() {
            if a.position_embedding_type == "rope" {
                m.insert("rotary_base".into(), json!(a.rotary_base));
                m.insert("rotary_percent".into(), json!(a.rotary_percent));
                m.insert("rotary_interleaved".into(), json!(a.rotary_interleaved));
            }
            if a.group_query_attention {
                m.insert("num_query_groups".into(), json!(a.num_query_groups));
            }
            if let Some(k) = a.kv_channels {
                m.insert("kv_channels".into(), json!(k));
            }
            if a.disable_bias_linear {
                m.insert("add_bias_linear".into(), json!(false));
            }
            if a.add_qkv_bias {
                m.insert("add_qkv_bias".into(), json!(true));
            }
            a.llama.insert_into(m);
            // Mixed precision only when asked: other model plugins reject fields they do not know.
            if let Some(dtype) = self.params_dtype() {
                m.insert("params_dtype".into(), json!(dtype));
                if a.fp32_residual_connection {
                    m.insert("fp32_residual_connection".into(), json!(true));
                }
                if a.grad_reduce_in_bf16 {
                    m.insert("grad_reduce_in_bf16".into(), json!(true));
                }
            }
            if a.sequence_parallel {
                m.insert("sequence_parallel".into(), json!(true));
            }
            if a.recompute_granularity.as_deref() == Some("full") {
                let method = a.recompute_method.clone().unwrap_or_default();
                m.insert(
                    "recompute".into(),
                    json!({"method": method, "num_layers": a.recompute_num_layers.unwrap_or(1)}),
                );
            }
        }
        // Only when given: models without pipeline stages reject fields they do not know.
        let split = [
            ("decoder_first_pipeline_num_layers", a.decoder_first_pipeline_num_layers),
            ("decoder_last_pipeline_num_layers", a.decoder_last_pipeline_num_layers),
        ];
        for (name, n) in split {
            if let (Some(n), Some(m)) = (n, config.as_object_mut()) {
                m.insert(name.into(), json!(n));
            }
        }
        config
    }

    /// The loss-scaler flags (SPEC §6.7).
    #[cfg(feature = "optim")]
    pub fn loss_scale_flags(&self) -> megatron_optim::LossScaleFlags {
        loss_scale_flags(&self.args)
    }

    /// The half dtype of `--bf16` / `--fp16`, `None` for fp32 training.
    pub fn params_dtype(&self) -> Option<megatron_core::DType> {
        match (self.args.bf16, self.args.fp16) {
            (true, _) => Some(megatron_core::DType::BF16),
            (false, true) => Some(megatron_core::DType::F16),
            (false, false) => None,
        }
    }

    /// Model chunks per pipeline rank (interleaved 1F1B; 1 without it). Validated in
    /// [`TrainConfig::new`](crate::virtual_pipeline_args).
    pub fn virtual_pipeline_size(&self) -> usize {
        crate::virtual_pipeline_args::virtual_pipeline_size(&self.args).unwrap_or(1)
    }

    /// Padded vocabulary (SPEC §3.2).
    pub fn padded_vocab(&self, vocab_size: usize) -> usize {
        let m = self.args.make_vocab_size_divisible_by * self.args.tensor_model_parallel_size;
        vocab_size.div_ceil(m) * m
    }
}

#[cfg(feature = "optim")]
fn loss_scale_flags(a: &PretrainArgs) -> megatron_optim::LossScaleFlags {
    megatron_optim::LossScaleFlags {
        fp16: a.fp16,
        bf16: a.bf16,
        loss_scale: a.loss_scale,
        initial_loss_scale: a.initial_loss_scale,
        min_loss_scale: a.min_loss_scale,
        loss_scale_window: a.loss_scale_window,
        hysteresis: a.hysteresis,
    }
}
