//! Builds a [`Trainer`] from a validated config: backend, communicator and parallel context,
//! tokenizer, datasets, model, optimizer, LR schedule, pipeline schedule and metrics sinks,
//! all looked up by name in the plugin registry; then loads `--load` if it has a checkpoint.

use super::{data::DataCursor, TrainState, Trainer};
use crate::config::TrainConfig;
use anyhow::{Context, Result};
use megatron_core::registry::{DatasetEnv, ModelEnv};
use megatron_core::{Communicator, MetricsSink, Registry};
use serde_json::json;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// The trainer of a one-rank world (the `single` communicator).
pub fn build_trainer(cfg: TrainConfig, registry: &Registry, stop: Arc<AtomicBool>) -> Result<Trainer> {
    let comm = registry
        .communicators("single", json!({}), 1)?
        .into_iter()
        .next()
        .context("the communicator plugin returned no endpoint")?;
    build_trainer_with_comm(cfg, registry, stop, comm)
}

/// The trainer of the rank `comm` is the endpoint of (src/train/multi_rank.rs builds one per
/// thread).
pub fn build_trainer_with_comm(
    cfg: TrainConfig,
    registry: &Registry,
    stop: Arc<AtomicBool>,
    comm: Arc<dyn Communicator>,
) -> Result<Trainer> {
    let a = &cfg.args;
    let backend = registry.backend(&a.backend, json!({ "threads": a.threads })).context("building the backend")?;
    let strategy = registry.strategy(
        "megatron",
        json!({
            "tensor_model_parallel_size": a.tensor_model_parallel_size,
            "pipeline_model_parallel_size": a.pipeline_model_parallel_size,
            "context_parallel_size": a.context_parallel_size,
            "ddp_bucket_size": a.ddp_bucket_size,
            "overlap_grad_reduce": a.overlap_grad_reduce,
            "expert_model_parallel_size": a.moe.expert_model_parallel_size,
            "expert_tensor_parallel_size": a.moe.expert_tensor_parallel_size,
        }),
    )?;
    let ctx = strategy.build_context(comm)?;

    // Tokenizer → vocabulary size (mock data without a tokenizer uses --vocab-size).
    let tokenizer = match &cfg.tokenizer_type {
        Some(t) => {
            Some(registry.tokenizer(t, cfg.tokenizer_config()).with_context(|| format!("building tokenizer {t}"))?)
        }
        None => None,
    };
    let vocab_size = match (&tokenizer, a.tokenizer.vocab_size) {
        (Some(t), _) => t.vocab_size(),
        (None, Some(v)) => v,
        (None, None) => anyhow::bail!("--mock-data without --tokenizer-type needs --vocab-size"),
    };
    let padded = cfg.padded_vocab(vocab_size);
    if ctx.rank == 0 {
        println!(" > padded vocab (size: {vocab_size}) with {} dummy tokens (new size: {padded})", padded - vocab_size);
    }
    // Before datasets and model: refuse a run that cannot fit (src/train/memory.rs).
    if let Some(e) = super::memory::check(&cfg, vocab_size, padded)? {
        if ctx.rank == 0 {
            println!(
                " > memory estimate: {:.3} GiB (parameters + gradients + optimizer state {:.3} GiB, activations {:.3} GiB)",
                e.total() as f64 / (1u64 << 30) as f64,
                (e.param_bytes + e.grad_bytes + e.optimizer_bytes) as f64 / (1u64 << 30) as f64,
                e.activation_bytes as f64 / (1u64 << 30) as f64
            );
        }
    }
    let tokenizer_fingerprint =
        tokenizer.as_ref().map(|t| t.fingerprint()).unwrap_or_else(|| format!("vocab:{vocab_size}"));

    // The tokenizer as Megatron describes it: part of the dataset cache hash (SPEC §2.5).
    #[cfg(feature = "datasets")]
    let tokenizer_description = cfg.tokenizer_type.as_deref().and_then(|t| {
        let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.to_string_lossy().into_owned());
        let (vocab, merge) = (path(&a.tokenizer.vocab_file), path(&a.tokenizer.merge_file));
        megatron_datasets::TokenizerDescription::for_megatron_type_with(
            t,
            vocab.as_deref(),
            merge.as_deref(),
            a.tokenizer.vocab_size,
            !a.tokenizer.tokenizer_hf_no_include_special_tokens,
        )
    });
    #[cfg(not(feature = "datasets"))]
    let tokenizer_description: Option<()> = None;
    let [n_train, n_valid, n_test] = cfg.split_samples;
    // Megatron builds dataset indices on rank 0 first (it writes the cache), then the rest.
    let rank0_first = ctx.world_size() > 1;
    if rank0_first && ctx.rank != 0 {
        wait_for_rank0(&ctx, true)?;
    }
    let splits = if a.mock_data {
        registry.dataset(
            "mock",
            json!({ "seq_length": a.seq_length, "vocab_size": vocab_size, "seed": a.seed,
                    "num_samples": [n_train, n_valid, n_test] }),
            &DatasetEnv { tokenizer: tokenizer.clone() },
        )
    } else if a.model == "bert" {
        registry.dataset(
            "bert",
            crate::bert_args::dataset_config(a, [n_train, n_valid, n_test]),
            &DatasetEnv { tokenizer: tokenizer.clone() },
        )
    } else if a.model == "t5" {
        registry.dataset(
            "t5",
            crate::t5_args::dataset_config(a, [n_train, n_valid, n_test]),
            &DatasetEnv { tokenizer: tokenizer.clone() },
        )
    } else {
        registry.dataset(
            "gpt",
            json!({ "data_path": a.data_path, "split": a.split,
                    "train_data_path": a.train_data_path, "valid_data_path": a.valid_data_path,
                    "test_data_path": a.test_data_path, "data_cache_path": a.data_cache_path,
                    "mid_level_dataset_surplus": a.mid_level_dataset_surplus,
                    "tokenizer": tokenizer_description,
                    "seq_length": a.seq_length, "seed": a.seed, "num_samples": [n_train, n_valid, n_test],
                    "eod_token": tokenizer.as_ref().and_then(|t| t.special_ids().eod) }),
            &DatasetEnv { tokenizer: tokenizer.clone() },
        )
    };
    if rank0_first && ctx.rank == 0 {
        wait_for_rank0(&ctx, splits.is_ok())?;
    }
    let splits = splits?;
    let (mbs, dp, dp_rank) = (a.micro_batch_size, ctx.dp_size(), ctx.dp_rank);
    let cursor =
        |d: Option<Arc<dyn megatron_core::Dataset>>, name| d.map(|d| DataCursor::new(d, name, mbs, dp, dp_rank));
    let train = cursor(splits.train, "train");
    anyhow::ensure!(train.is_some(), "the --split string gives the training split no data");

    // `--num-experts`: the `moe` plugin fills the MLP slots (an error naming the plugin otherwise);
    // with --expert-model-parallel-size / --expert-tensor-parallel-size the strategy folded the
    // expert grid over TP×CP×DP (§5.8); the plugin splits the tokens over TP itself, or takes
    // the sequence-parallel shard it is given.
    let moe_provider = match a.moe.plugin_config(cfg.num_microbatches) {
        Some(config) => Some(registry.mlp_provider("moe", config)?),
        None => None,
    };
    let vp = cfg.virtual_pipeline_size();
    let build = |ctx: megatron_core::ParallelContext| {
        registry
            .model(
                &a.model,
                cfg.model_config(vocab_size),
                &ModelEnv { backend: backend.clone(), ctx, mlp: moe_provider.clone() },
            )
            .with_context(|| format!("building model `{}`", a.model))
    };
    // Interleaved 1F1B (SPEC §5.5): one model per chunk (virtual stage), as one composite.
    let model: Box<dyn megatron_core::Model> = if vp > 1 {
        let chunks = (0..vp).map(|c| build(ctx.clone().with_virtual_stage(vp, c)?)).collect::<Result<Vec<_>>>()?;
        Box::new(megatron_core::ModelChunks::new(chunks)?)
    } else {
        build(ctx.clone())?
    };
    let optimizer = match a.optimizer.as_str() {
        "adam" => {
            registry.optimizer("adam", json!({ "beta1": a.adam_beta1, "beta2": a.adam_beta2, "eps": a.adam_eps }))?
        }
        "sgd" => registry.optimizer("sgd", json!({ "momentum": a.sgd_momentum }))?,
        other => registry.optimizer(other, json!({}))?,
    };
    let lr_config = megatron_optim::lr_schedule_config_from_flags(&super::checkpointing::lr_flags(&cfg))?;
    let lr_schedule = registry.lr_schedule("megatron", serde_json::to_value(lr_config)?)?;
    // Pipelined runs need a schedule that moves activations between stages (SPEC §5.5).
    let schedule = if vp > 1 {
        let group = a.microbatch_group_size_per_virtual_pipeline_stage;
        registry.schedule("interleaved-1f1b", json!({ "microbatch_group_size": group }))?
    } else {
        registry.schedule(if ctx.pp_size() > 1 { "1f1b" } else { "no-pipelining" }, json!({}))?
    };
    let (grad_sync, optimizer, gather) = if a.use_distributed_optimizer {
        let (sync, opt, gather) = distributed_optimizer(&cfg, &model.params(), backend.clone(), &ctx)?;
        (Some(sync), opt, gather)
    } else {
        (strategy.grad_sync(&model.params(), backend.clone(), &ctx)?, optimizer, None)
    };
    // --overlap-param-gather: the model waits per module when it supports the pre-hook.
    let mut model = model;
    let param_gather = gather.as_ref().map(|g| {
        let hook: megatron_core::SharedForwardPreHook = g.clone();
        super::param_gather::OverlapParamGather { per_module: model.set_forward_pre_hook(hook.clone()), hook }
    });
    // --bf16/--fp16: the optimizer steps fp32 main parameters (SPEC §6.7). The distributed
    // optimizer keeps those of its own shard itself (SPEC §5.7), so it is not wrapped.
    let optimizer: Box<dyn megatron_core::Optimizer> = match cfg.params_dtype() {
        Some(_) if !a.use_distributed_optimizer => Box::new(megatron_optim::MixedPrecisionOptimizer::new(optimizer)),
        _ => optimizer,
    };
    let loss_scaler = megatron_optim::LossScaler::from_flags(&cfg.loss_scale_flags())?;

    let mut sinks: Vec<Box<dyn MetricsSink>> = Vec::new();
    if let Some(dir) = &a.tensorboard_dir {
        sinks.push(registry.metrics_sink("tensorboard", json!({ "dir": dir }))?);
    }
    if let Some(path) = &a.metrics_jsonl {
        sinks.push(registry.metrics_sink("jsonl", json!({ "path": path }))?);
    }
    let mut trainer = Trainer {
        valid: cursor(splits.valid, "validation"),
        test: cursor(splits.test, "test"),
        train,
        cfg,
        backend,
        ctx,
        strategy,
        model,
        optimizer,
        lr_schedule,
        schedule,
        grad_sync,
        sinks,
        state: TrainState::default(),
        tokenizer_fingerprint,
        stop,
        loss_scaler,
        guard: Default::default(),
        param_gather,
    };
    trainer.maybe_load()?;
    Ok(trainer)
}

/// The reducer, the optimizer and (with `--overlap-param-gather`) its background all-gather,
/// which is also the model's forward pre-hook.
type DistributedOptimizerParts = (
    Box<dyn megatron_core::GradSync>,
    Box<dyn megatron_core::Optimizer>,
    Option<std::sync::Arc<std::sync::Mutex<megatron_optim::ParamGather>>>,
);

/// `--use-distributed-optimizer` (SPEC §5.7): a DDP reducer that reduce-scatters its buckets
/// and the ZeRO-1 Adam that owns the same ranges. With pp > 1 and tied embeddings the word
/// embedding gets a bucket of its own, so both stages shard it the same way.
#[cfg(feature = "parallel")]
fn distributed_optimizer(
    cfg: &crate::config::TrainConfig,
    params: &[&megatron_core::Param],
    backend: std::sync::Arc<dyn megatron_core::Backend>,
    ctx: &megatron_core::ParallelContext,
) -> Result<DistributedOptimizerParts> {
    let a = &cfg.args;
    let options = megatron_parallel::DdpOptions {
        bucket_size: a.ddp_bucket_size,
        overlap_grad_reduce: a.overlap_grad_reduce,
        shard_for_distributed_optimizer: true,
    };
    let separate: Vec<String> = if ctx.pp_size() > 1 && !a.untie_embeddings_and_output_weights {
        vec!["embedding.word_embeddings.weight".to_string()]
    } else {
        Vec::new()
    };
    let reducer =
        megatron_parallel::DdpReducer::with_separate_buckets(params, options, &separate, backend.clone(), ctx)?;
    let buckets = reducer
        .shard_layout()
        .into_iter()
        .map(|b| megatron_optim::ShardedBucket { params: b.params, padded_numel: b.padded_numel })
        .collect();
    let adam = megatron_optim::AdamConfig { beta1: a.adam_beta1, beta2: a.adam_beta2, eps: a.adam_eps };
    let group = reducer.group().clone();
    let mut opt = megatron_optim::DistributedOptimizer::new(adam, buckets, ctx.comm.clone(), group, params)?;
    if a.overlap_param_gather {
        opt.overlap_param_gather(backend)?;
    }
    let gather = opt.param_gather();
    Ok((Box::new(reducer), Box::new(opt), gather))
}

#[cfg(not(feature = "parallel"))]
fn distributed_optimizer(
    _: &crate::config::TrainConfig,
    _: &[&megatron_core::Param],
    _: std::sync::Arc<dyn megatron_core::Backend>,
    _: &megatron_core::ParallelContext,
) -> Result<DistributedOptimizerParts> {
    anyhow::bail!("--use-distributed-optimizer needs the `parallel` feature")
}

/// The world barrier between rank 0 building the datasets and the others: rank 0 reports
/// whether it succeeded, and the others fail (instead of waiting forever) when it did not.
fn wait_for_rank0(ctx: &megatron_core::ParallelContext, ok: bool) -> Result<()> {
    let mut failed = [if ok { 0.0 } else { 1.0 }];
    ctx.comm.all_reduce_f64(&ctx.world_group, &mut failed, megatron_core::ReduceOp::Max)?;
    anyhow::ensure!(failed[0] == 0.0 || ctx.rank == 0, "rank 0 failed to build the datasets (see its error)");
    Ok(())
}
