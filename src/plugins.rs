//! The driver's side of the plugin system: which built-in plugin comes with which Cargo
//! feature of the `megatron` package (so a missing one is reported as "not compiled in:
//! rebuild with --features X"), and `megatron --plugin PATH` loading of plugin libraries.

use anyhow::{Context, Result};
use megatron_core::{PluginKind, Registry};
use std::path::PathBuf;

/// Every built-in plugin: `(Cargo feature of the megatron package, kind, name)`. The registry
/// of a build holds exactly the entries whose feature is enabled (tests/registry_features.rs).
pub const BUILTIN_PLUGINS: &[(&str, PluginKind, &str)] = &[
    ("cpu", PluginKind::Backend, "cpu"),
    ("parallel", PluginKind::Communicator, "single"),
    ("comm-local", PluginKind::Communicator, "local"),
    ("mpi", PluginKind::Communicator, "mpi"),
    ("parallel", PluginKind::ParallelStrategy, "megatron"),
    ("parallel", PluginKind::Schedule, "no-pipelining"),
    ("parallel", PluginKind::Schedule, "1f1b"),
    ("parallel", PluginKind::Schedule, "interleaved-1f1b"),
    ("gpt", PluginKind::Model, "gpt"),
    ("optim", PluginKind::Optimizer, "adam"),
    ("optim", PluginKind::Optimizer, "sgd"),
    ("optim", PluginKind::LrSchedule, "megatron"),
    ("datasets", PluginKind::Dataset, "gpt"),
    ("datasets", PluginKind::Dataset, "mock"),
    ("tokenizers", PluginKind::Tokenizer, "GPT2BPETokenizer"),
    ("tokenizers", PluginKind::Tokenizer, "NullTokenizer"),
    ("tokenizers", PluginKind::Tokenizer, "BertWordPieceCase"),
    ("tokenizers", PluginKind::Tokenizer, "BertWordPieceLowerCase"),
    ("metrics", PluginKind::MetricsSink, "jsonl"),
    ("metrics", PluginKind::MetricsSink, "tensorboard"),
    ("example-mlp-lm", PluginKind::Model, "swiglu-mlp-lm"),
    ("t5", PluginKind::Model, "t5"),
    ("datasets", PluginKind::Dataset, "t5"),
    ("moe", PluginKind::Mlp, "moe"),
    ("bert", PluginKind::Model, "bert"),
    ("hybrid", PluginKind::Model, "hybrid"),
    ("hybrid", PluginKind::Model, "mamba"),
    ("datasets", PluginKind::Dataset, "bert"),
];

/// Whether the named Cargo feature of the megatron package is enabled in this build.
pub fn feature_enabled(feature: &str) -> bool {
    match feature {
        "cpu" => cfg!(feature = "cpu"),
        "gpt" => cfg!(feature = "gpt"),
        "optim" => cfg!(feature = "optim"),
        "parallel" => cfg!(feature = "parallel"),
        "comm-local" => cfg!(feature = "comm-local"),
        "mpi" => cfg!(feature = "mpi"),
        "datasets" => cfg!(feature = "datasets"),
        "tokenizers" => cfg!(feature = "tokenizers"),
        "metrics" => cfg!(feature = "metrics"),
        "checkpoint" => cfg!(feature = "checkpoint"),
        "example-mlp-lm" => cfg!(feature = "example-mlp-lm"),
        "t5" => cfg!(feature = "t5"),
        "moe" => cfg!(feature = "moe"),
        "bert" => cfg!(feature = "bert"),
        "hybrid" => cfg!(feature = "hybrid"),
        _ => false,
    }
}

/// The features `megatron pretrain` needs beyond `minimal`: the driver calls into optim and
/// checkpoint directly and builds the parallel strategy and the dataset by name.
pub const PRETRAIN_FEATURES: &[&str] = &["optim", "checkpoint", "parallel", "datasets"];

/// The registry of this build plus the `--plugin` libraries, with a "rebuild with --features"
/// hint for every built-in plugin whose feature is off.
pub fn registry_with_plugins(paths: &[PathBuf]) -> Result<Registry> {
    let mut registry = Registry::builtin()?;
    for &(feature, kind, name) in BUILTIN_PLUGINS {
        if !feature_enabled(feature) {
            let mut hint = format!(
                "rebuild with `cargo build --release --features {feature}` (Cargo feature `{feature}` of the megatron package)"
            );
            if feature == "moe" {
                hint = format!(
                    "--num-experts needs the Mixture-of-Experts plugin: load it with `megatron --plugin \
                     target/release/libmegatron_moe.so pretrain ...` (built by `cargo build --release -p megatron-moe`) \
                     or {hint}"
                );
            }
            registry.add_hint(kind, name, hint);
        }
    }
    for path in paths {
        registry.load_library(path).with_context(|| format!("--plugin {}", path.display()))?;
    }
    Ok(registry)
}

/// The error of `megatron pretrain` in a build without what it needs (e.g. `minimal`).
pub fn missing_pretrain_features() -> Option<String> {
    let missing: Vec<&str> = PRETRAIN_FEATURES.iter().copied().filter(|f| !feature_enabled(f)).collect();
    (!missing.is_empty()).then(|| {
        format!(
            "`megatron pretrain` is not compiled into this build: it needs the plugin crates of the Cargo \
             features {}; rebuild with `cargo build --release --features {}` (or the default features)",
            missing.join(", "),
            missing.join(",")
        )
    })
}
