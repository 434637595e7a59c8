//! `megatron finetune --task RACE` (SPEC §9.3) end to end on the synthetic RACE-format fixture
//! of `scripts/race_fixture.py` (`datasets/tests/fixtures/race`: 24 training and 12 dev
//! questions, 4 options each; the right option holds a word of w120..w129, the others of
//! w130..w149): a tiny random post-LN BERT imported with `megatron import hf` learns it (the
//! training loss falls, dev accuracy ends above chance) and a checkpoint per epoch is written;
//! with dropout 0 the first steps equal transformers' `BertForMultipleChoice`
//! (`scripts/bert_finetune_step_check.py`, skipped without a python with transformers).

mod tiny_bert;
use clap::Parser;
use megatron::finetune_cli::{FinetuneArgs, FinetuneSummary};
use std::path::{Path, PathBuf};
use std::process::Command;
use tiny_bert::write_tiny_hf_bert;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn race(split: &str) -> String {
    root().join("datasets/tests/fixtures/race").join(split).to_str().unwrap().to_string()
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

fn megatron(args: &[&str]) {
    let cli = megatron::cli::Cli::try_parse_from(std::iter::once("megatron").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("{e}"));
    megatron::cli::run(cli).unwrap();
}

/// `megatron finetune --task RACE` from the tiny model in `ckpt`, with `extra` flags.
fn finetune(ckpt: &Path, extra: &[&str]) -> anyhow::Result<FinetuneSummary> {
    let (train, dev) = (race("train"), race("dev"));
    let mut argv = vec!["megatron", "finetune", "--task", "RACE", "--train-data", &train, "--valid-data", &dev];
    let ck = s(ckpt);
    argv.extend(["--load", &ck, "--micro-batch-size", "4", "--seq-length", "24", "--log-interval", "6"]);
    argv.extend(extra);
    let cli = megatron::cli::Cli::try_parse_from(argv)?;
    let megatron::cli::Command::Finetune(args) = cli.command else { unreachable!("parsed a finetune command") };
    let args: &FinetuneArgs = &args;
    megatron::finetune_cli::finetune(args, &megatron_core::Registry::builtin()?)
}

fn tiny_checkpoint(dir: &Path) -> PathBuf {
    let (hf, ckpt) = (dir.join("hf"), dir.join("ckpt"));
    write_tiny_hf_bert(&hf, 7);
    megatron(&["import", "hf", "--hf-dir", &s(&hf), "--save", &s(&ckpt)]);
    ckpt
}

#[test]
fn race_finetuning_learns_the_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = tiny_checkpoint(dir.path());
    let out = dir.path().join("race_ckpt");
    let o = s(&out);
    let summary = finetune(
        &ckpt,
        &["--epochs", "15", "--lr", "1e-2", "--lr-warmup-fraction", "0.1", "--weight-decay", "0.1", "--save", &o],
    )
    .unwrap();
    println!("training loss per epoch: {:?}", summary.epoch_losses);
    println!("dev accuracy per epoch: {:?}", summary.accuracies);
    let (first, last) = (summary.epoch_losses[0], *summary.epoch_losses.last().unwrap());
    // Chance is ln 4 = 1.386 per question.
    assert!((first - 4f64.ln()).abs() < 0.3, "first epoch loss {first} should be near ln 4");
    assert!(last < 0.5 * first, "training loss {first:.3} -> {last:.3} did not fall");
    let acc = summary.accuracies.last().unwrap()[0];
    assert!(acc > 50.0, "dev accuracy {acc}% (chance 25%)");
    // One checkpoint per epoch, the last at iteration 15 epochs x 6 steps.
    let tracker = std::fs::read_to_string(out.join("latest_checkpointed_iteration.txt")).unwrap();
    assert_eq!(tracker.trim(), "90");
}

#[test]
fn race_errors_name_the_input() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = tiny_checkpoint(dir.path());
    let e = format!("{:#}", finetune(&ckpt, &["--task", "RACEX"]).unwrap_err());
    assert!(e.contains("RACE") && e.contains("MNLI"), "{e}");
    let tsv = dir.path().join("x.tsv");
    std::fs::write(&tsv, "a\tb\n").unwrap();
    let e = format!("{:#}", finetune(&ckpt, &["--valid-data", &s(&tsv)]).unwrap_err());
    assert!(e.contains("RACE directory"), "{e}");
}

fn python() -> Option<String> {
    let py = std::env::var("MEGATRON_PYTHON").unwrap_or_else(|_| "/work/venv/bin/python".into());
    let ok = Command::new(&py).args(["-c", "import torch, transformers, safetensors"]).output();
    ok.map(|o| o.status.success()).unwrap_or(false).then_some(py)
}

#[test]
fn race_steps_equal_transformers_multiple_choice() {
    let Some(py) = python() else {
        eprintln!("SKIP race_steps_equal_transformers_multiple_choice: no python with torch + transformers at /work/venv/bin/python (set MEGATRON_PYTHON)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = tiny_checkpoint(dir.path());
    let dump = dir.path().join("race_step.st");
    let d = s(&dump);
    #[rustfmt::skip]
    let flags = ["--lr", "1e-3", "--lr-warmup-fraction", "0", "--hidden-dropout", "0", "--attention-dropout", "0",
                 "--dump-first-step", &d, "--dump-steps", "2"];
    finetune(&ckpt, &flags).unwrap();
    let out = Command::new(&py)
        .arg(root().join("scripts/bert_finetune_step_check.py"))
        .args([&dump, &dir.path().join("hf")])
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    assert!(out.status.success(), "the RACE steps differ from transformers' BertForMultipleChoice:\n{text}");
}
