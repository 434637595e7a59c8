//! The registry of this build holds exactly the built-in plugins of the enabled Cargo features
//! of the `megatron` package (the same test runs in every feature set: the expected list is
//! gated on `cfg!(feature = ...)`), `megatron list` prints them with their origin, duplicate
//! names are an error naming both crates, and a plugin of a disabled feature is reported as
//! "not compiled in" with the feature to enable.
//!
//! Run it for the minimal build too:
//! `cargo test --no-default-features --features minimal --test registry_features`.

use megatron_core::registry::{ConfigDe, Origin};
use megatron_core::{Backend, Factory, Plugin, PluginCrate, PluginKind, Registry};
use std::process::Command;
use std::sync::Arc;

/// `(kind, name, crate)` of every built-in plugin this build must have, written out by hand.
fn expected() -> Vec<(&'static str, &'static str, &'static str)> {
    let mut want = Vec::new();
    let mut add = |on: bool, entries: &[(&'static str, &'static str, &'static str)]| {
        if on {
            want.extend_from_slice(entries);
        }
    };
    add(cfg!(feature = "cpu"), &[("backend", "cpu", "megatron-cpu")]);
    add(
        cfg!(feature = "parallel"),
        &[
            ("communicator", "single", "megatron-parallel"),
            ("parallel-strategy", "megatron", "megatron-parallel"),
            ("schedule", "no-pipelining", "megatron-parallel"),
            ("schedule", "1f1b", "megatron-parallel"),
            ("schedule", "interleaved-1f1b", "megatron-parallel"),
        ],
    );
    add(cfg!(feature = "comm-local"), &[("communicator", "local", "megatron-comm-local")]);
    add(cfg!(feature = "gpt"), &[("model", "gpt", "megatron-gpt")]);
    add(
        cfg!(feature = "optim"),
        &[
            ("optimizer", "adam", "megatron-optim"),
            ("optimizer", "sgd", "megatron-optim"),
            ("lr-schedule", "megatron", "megatron-optim"),
        ],
    );
    add(
        cfg!(feature = "datasets"),
        &[
            ("dataset", "gpt", "megatron-datasets"),
            ("dataset", "mock", "megatron-datasets"),
            ("dataset", "t5", "megatron-datasets"),
            ("dataset", "bert", "megatron-datasets"),
        ],
    );
    add(
        cfg!(feature = "tokenizers"),
        &[
            ("tokenizer", "GPT2BPETokenizer", "megatron-tokenizers"),
            ("tokenizer", "NullTokenizer", "megatron-tokenizers"),
            ("tokenizer", "BertWordPieceCase", "megatron-tokenizers"),
            ("tokenizer", "BertWordPieceLowerCase", "megatron-tokenizers"),
        ],
    );
    add(
        cfg!(feature = "metrics"),
        &[("metrics", "jsonl", "megatron-metrics"), ("metrics", "tensorboard", "megatron-metrics")],
    );
    add(cfg!(feature = "example-mlp-lm"), &[("model", "swiglu-mlp-lm", "megatron-example-mlp-lm")]);
    add(cfg!(feature = "t5"), &[("model", "t5", "megatron-t5")]);
    add(cfg!(feature = "moe"), &[("mlp", "moe", "megatron-moe")]);
    add(cfg!(feature = "bert"), &[("model", "bert", "megatron-bert")]);
    add(cfg!(feature = "hybrid"), &[("model", "hybrid", "megatron-hybrid"), ("model", "mamba", "megatron-hybrid")]);
    want.sort();
    want
}

fn registered(registry: &Registry) -> Vec<(&'static str, String, String)> {
    let mut got: Vec<_> = registry
        .entries()
        .map(|e| (e.plugin.factory.kind().as_str(), e.plugin.name.to_string(), e.crate_name.clone()))
        .collect();
    got.sort();
    got
}

#[test]
fn registry_holds_exactly_the_plugins_of_the_enabled_features() -> anyhow::Result<()> {
    let registry = Registry::builtin()?;
    let want: Vec<_> = expected().into_iter().map(|(k, n, c)| (k, n.to_string(), c.to_string())).collect();
    assert_eq!(registered(&registry), want);
    assert!(registry.entries().all(|e| e.origin == Origin::BuiltIn && e.guard.is_none()));
    // The driver's feature table (used for "not compiled in" hints) agrees with the registry.
    let mut table: Vec<_> = megatron::plugins::BUILTIN_PLUGINS
        .iter()
        .filter(|(f, _, _)| megatron::plugins::feature_enabled(f))
        .map(|&(_, k, n)| (k.as_str(), n.to_string()))
        .collect();
    table.sort();
    let names: Vec<_> = want.iter().map(|(k, n, _)| (*k, n.clone())).collect();
    assert_eq!(table, names);
    Ok(())
}

#[test]
fn list_prints_kind_name_version_crate_and_origin() -> anyhow::Result<()> {
    let out = Command::new(env!("CARGO_BIN_EXE_megatron")).arg("list").output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout)?;
    let rows: Vec<Vec<&str>> = stdout.lines().skip(1).map(|l| l.split_whitespace().collect()).collect();
    let mut got: Vec<_> = rows.iter().map(|r| (r[0], r[1].to_string(), r[3].to_string())).collect();
    got.sort();
    let want: Vec<_> = expected().into_iter().map(|(k, n, c)| (k, n.to_string(), c.to_string())).collect();
    assert_eq!(got, want, "{stdout}");
    assert!(rows.iter().all(|r| r.len() == 5 && r[2] == env!("CARGO_PKG_VERSION") && r[4] == "built-in"), "{stdout}");
    let out = Command::new(env!("CARGO_BIN_EXE_megatron")).args(["list", "--kind", "model"]).output()?;
    let stdout = String::from_utf8(out.stdout)?;
    assert!(stdout.lines().skip(1).all(|l| l.starts_with("model ")), "{stdout}");
    Ok(())
}

fn fake_backend(_: ConfigDe) -> megatron_core::Result<Arc<dyn Backend>> {
    anyhow::bail!("never built")
}

fn clashing_plugins() -> Vec<Plugin> {
    vec![Plugin { name: "cpu", description: "clash", factory: Factory::Backend(fake_backend) }]
}

#[test]
fn a_duplicate_name_is_an_error_naming_both_crates() -> anyhow::Result<()> {
    let mut registry = Registry::builtin()?;
    let krate = PluginCrate { crate_name: "my-clashing-crate", version: "9.9.9", plugins: clashing_plugins };
    let result = registry.add_crate(&krate, Origin::Library("libclash.so".into()));
    if cfg!(feature = "cpu") {
        let msg = format!("{:#}", result.err().ok_or_else(|| anyhow::anyhow!("no clash reported"))?);
        assert!(msg.contains("duplicate backend plugin `cpu`"), "{msg}");
        assert!(
            msg.contains("`megatron-cpu` (built-in)") && msg.contains("`my-clashing-crate` (libclash.so)"),
            "{msg}"
        );
    } else {
        result?;
    }
    Ok(())
}

#[test]
fn a_plugin_of_a_disabled_feature_says_which_feature_to_enable() -> anyhow::Result<()> {
    let registry = megatron::plugins::registry_with_plugins(&[])?;
    for &(feature, kind, name) in megatron::plugins::BUILTIN_PLUGINS {
        let found = registry.get(kind, name);
        if megatron::plugins::feature_enabled(feature) {
            found?;
        } else {
            let msg = format!("{:#}", found.err().ok_or_else(|| anyhow::anyhow!("{name} should be missing"))?);
            assert!(
                msg.contains("not compiled into this build") && msg.contains(&format!("--features {feature}")),
                "{msg}"
            );
        }
    }
    let msg = format!(
        "{:#}",
        registry.get(PluginKind::Model, "no-such-model").err().map(|e| e.to_string()).unwrap_or_default()
    );
    assert!(msg.contains("no model plugin named `no-such-model`"), "{msg}");
    Ok(())
}

/// In a build without the driver's crates (`minimal`), `megatron pretrain` names the features
/// to rebuild with; in the full build the same flags train.
#[test]
fn pretrain_reports_missing_features_or_runs() -> anyhow::Result<()> {
    let flags = "pretrain --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 8 --micro-batch-size 2 \
                 --lr 1e-3 --mock-data --vocab-size 32 --train-iters 2 --eval-iters 1 --threads 1";
    let out = Command::new(env!("CARGO_BIN_EXE_megatron")).args(flags.split_whitespace()).output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    match megatron::plugins::missing_pretrain_features() {
        Some(_) => {
            assert!(!out.status.success());
            assert!(stderr.contains("not compiled into this build") && stderr.contains("--features"), "{stderr}");
        }
        None => assert!(out.status.success(), "{stderr}"),
    }
    Ok(())
}
