//! Builds a [`Trainer`] from a validated config: backend, communicator and parallel context,
//! tokenizer, datasets, model, optimizer, LR schedule, pipeline schedule and metrics sinks,
//! all looked up by name in the plugin registry; then loads `--load` if it has a checkpoint.

use super::{data::DataCursor, TrainState, Trainer};
use crate::config::TrainConfig;
use anyhow::{Context, Result};
use megatron_core::registry::{DatasetEnv, ModelEnv};
use megatron_core::{MetricsSink, Registry};
use serde_json::json;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

pub fn build_trainer(cfg: TrainConfig, registry: &Registry, stop: Arc<AtomicBool>) -> Result<Trainer> {
    let a = &cfg.args;
    let backend = registry.backend(&a.backend, json!({ "threads": a.threads })).context("building the backend")?;
    let comm = registry
        .communicators("single", json!({}), cfg.world_size)?
        .into_iter()
        .next()
        .context("the communicator plugin returned no endpoint")?;
    let strategy = registry.strategy(
        "megatron",
        json!({
            "tensor_model_parallel_size": a.tensor_model_parallel_size,
            "pipeline_model_parallel_size": a.pipeline_model_parallel_size,
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
    let vocab_size = match (&tokenizer, a.vocab_size) {
        (Some(t), _) => t.vocab_size(),
        (None, Some(v)) => v,
        (None, None) => anyhow::bail!("--mock-data without --tokenizer-type needs --vocab-size"),
    };
    let padded = cfg.padded_vocab(vocab_size);
    println!(" > padded vocab (size: {vocab_size}) with {} dummy tokens (new size: {padded})", padded - vocab_size);
    let tokenizer_fingerprint =
        tokenizer.as_ref().map(|t| t.fingerprint()).unwrap_or_else(|| format!("vocab:{vocab_size}"));

    let [n_train, n_valid, n_test] = cfg.split_samples;
    let splits = if a.mock_data {
        registry.dataset(
            "mock",
            json!({ "seq_length": a.seq_length, "vocab_size": vocab_size, "seed": a.seed,
                    "num_samples": [n_train, n_valid, n_test] }),
            &DatasetEnv { tokenizer: tokenizer.clone() },
        )?
    } else {
        registry.dataset(
            "gpt",
            json!({ "data_path": a.data_path, "split": a.split.clone().unwrap_or_else(|| "969,30,1".into()),
                    "seq_length": a.seq_length, "seed": a.seed, "num_samples": [n_train, n_valid, n_test],
                    "eod_token": tokenizer.as_ref().and_then(|t| t.special_ids().eod) }),
            &DatasetEnv { tokenizer: tokenizer.clone() },
        )?
    };
    let (mbs, dp, dp_rank) = (a.micro_batch_size, ctx.dp_size(), ctx.dp_rank);
    let cursor =
        |d: Option<Arc<dyn megatron_core::Dataset>>, name| d.map(|d| DataCursor::new(d, name, mbs, dp, dp_rank));
    let train = cursor(splits.train, "train");
    anyhow::ensure!(train.is_some(), "the --split string gives the training split no data");

    let model = registry
        .model(&a.model, cfg.model_config(vocab_size), &ModelEnv { backend: backend.clone(), ctx: ctx.clone() })
        .with_context(|| format!("building model `{}`", a.model))?;
    let optimizer = match a.optimizer.as_str() {
        "adam" => {
            registry.optimizer("adam", json!({ "beta1": a.adam_beta1, "beta2": a.adam_beta2, "eps": a.adam_eps }))?
        }
        "sgd" => registry.optimizer("sgd", json!({ "momentum": a.sgd_momentum }))?,
        other => registry.optimizer(other, json!({}))?,
    };
    let lr_config = megatron_optim::lr_schedule_config_from_flags(&super::checkpointing::lr_flags(&cfg))?;
    let lr_schedule = registry.lr_schedule("megatron", serde_json::to_value(lr_config)?)?;
    let schedule = registry.schedule("no-pipelining", json!({}))?;

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
        sinks,
        state: TrainState::default(),
        tokenizer_fingerprint,
        stop,
    };
    trainer.maybe_load()?;
    Ok(trainer)
}
