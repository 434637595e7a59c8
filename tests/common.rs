//! Helpers shared by the end-to-end tests.
#![allow(dead_code)]

use clap::Parser;
use megatron::cli::{Cli, Command};
use megatron::train::TrainSummary;
use megatron_core::Registry;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Flags of a tiny GPT on mock data (fast enough for debug-profile tests).
pub fn tiny_mock_flags() -> Vec<String> {
    "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16 \
     --micro-batch-size 2 --global-batch-size 4 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine \
     --lr-warmup-iters 3 --mock-data --vocab-size 100 --seed 7 --log-interval 5 --eval-interval 10 --eval-iters 2 \
     --hidden-dropout 0.1 --attention-dropout 0.1 --weight-decay 0.1 --adam-beta2 0.95"
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// Runs `megatron pretrain <flags>` in this process.
pub fn pretrain(flags: &[String]) -> anyhow::Result<TrainSummary> {
    let mut argv = vec!["megatron".to_string(), "pretrain".to_string()];
    argv.extend(flags.iter().cloned());
    let cli = Cli::try_parse_from(argv)?;
    let Command::Pretrain(args) = cli.command else { unreachable!("parsed a pretrain command") };
    let registry = Registry::builtin()?;
    megatron::cli::pretrain(&args, &registry, Arc::new(AtomicBool::new(false)))
}

pub fn flags(extra: &str) -> Vec<String> {
    extra.split_whitespace().map(String::from).collect()
}

/// The tiny mock flags with `extra` applied: a flag already present gets the new value,
/// others are appended (clap rejects a flag given twice).
pub fn tiny_with(extra: &str) -> Vec<String> {
    let mut out = tiny_mock_flags();
    let extra = flags(extra);
    let mut i = 0;
    while i < extra.len() {
        let flag = &extra[i];
        let value = extra.get(i + 1).filter(|v| !v.starts_with("--")).cloned();
        match (out.iter().position(|f| f == flag), &value) {
            (Some(j), Some(v)) => out[j + 1] = v.clone(),
            (Some(_), None) => {}
            (None, _) => {
                out.push(flag.clone());
                out.extend(value.clone());
            }
        }
        i += if value.is_some() { 2 } else { 1 };
    }
    out
}

/// `../shared/data` beside the repository, if present.
pub fn shared_data() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data");
    if p.is_dir() {
        Some(p)
    } else {
        eprintln!("SKIP: ../shared/data is absent (reference data lives beside the repository)");
        None
    }
}

/// Largest relative difference of two per-iteration series (`(iteration, value)`, the same
/// iterations in the same order: checked).
pub fn max_rel(a: &[(u64, f64)], b: &[(u64, f64)]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|((i, x), (j, y))| {
            assert_eq!(i, j);
            (x - y).abs() / y.abs().max(1e-12)
        })
        .fold(0.0, f64::max)
}

/// A series by its bits, so a NaN (the loss of a skipped iteration) equals itself.
pub fn bits(series: &[(u64, f64)]) -> Vec<(u64, u64)> {
    series.iter().map(|(i, v)| (*i, v.to_bits())).collect()
}

/// A NaN in this gradient forces a skipped step (fp16: an overflow for the loss scaler).
pub const NAN_PARAM: &str = "decoder.layers.1.mlp.linear_fc2.weight";

/// Half-precision flags with one skipped step: bf16 with a NaN gradient at iteration 12 (the
/// guard skips it); fp16 with a live scaler (2^16, doubled after 4 good steps, halved on every
/// overflow) and a forced overflow at 7 (the scaler skips it and backs off).
pub fn half_with_a_skipped_step(precision: &str) -> String {
    match precision {
        "bf16" => format!("--bf16 --inject-nan-grad 12:0:{NAN_PARAM}"),
        _ => format!(
            "--fp16 --initial-loss-scale 65536 --loss-scale-window 4 --hysteresis 1 --inject-nan-grad 7:0:{NAN_PARAM}"
        ),
    }
}

/// `pretrain` with `--metrics-jsonl` in a temporary directory: the summary and the loss scale of
/// every iteration.
pub fn pretrain_with_loss_scales(mut args: Vec<String>) -> (TrainSummary, Vec<(u64, f64)>) {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("metrics.jsonl");
    args.extend(["--metrics-jsonl".to_string(), jsonl.display().to_string()]);
    let summary = pretrain(&args).unwrap_or_else(|e| panic!("{}: {e:#}", args.join(" ")));
    let scales = std::fs::read_to_string(&jsonl)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["tag"] == "loss-scale")
        .map(|v| (v["iteration"].as_u64().unwrap(), v["value"].as_f64().unwrap()))
        .collect();
    (summary, scales)
}
