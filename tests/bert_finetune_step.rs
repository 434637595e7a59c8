//! One `megatron finetune` step against transformers (issue 15, item 4): a tiny random post-LN
//! BERT (2 layers, hidden 16, 4 heads, the BERT fixture's vocab.txt) written as a Hugging Face
//! directory, imported with `megatron import hf`, finetuned on 8 MRPC-layout rows (pairs of
//! different lengths, both labels, token types 0/1, padding) with dropout 0 and
//! `--dump-first-step --dump-steps 3` (one batch per epoch, 3 epochs, a reshuffle each);
//! `scripts/bert_finetune_step_check.py` runs the same steps in transformers'
//! `BertForSequenceClassification` and fails when the logits or loss of any step or any
//! gradient of the first differs beyond its tolerances (printed). Skipped with a
//! message when /work/venv/bin/python (or $MEGATRON_PYTHON) has no transformers.

mod tiny_bert;
use clap::Parser;
use std::path::{Path, PathBuf};
use std::process::Command;
use tiny_bert::write_tiny_hf_bert;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn python() -> Option<String> {
    let py = std::env::var("MEGATRON_PYTHON").unwrap_or_else(|_| "/work/venv/bin/python".into());
    let ok = Command::new(&py).args(["-c", "import torch, transformers, safetensors"]).output();
    ok.map(|o| o.status.success()).unwrap_or(false).then_some(py)
}

/// 8 MRPC rows of fixture words: 6 to 17 tokens per pair (the longest cut at 16), labels 0/1.
fn write_tsv(path: &Path) {
    let mut s = String::from("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n");
    for r in 0..8usize {
        let a: Vec<String> = (0..2 + r).map(|i| format!("w{}", (7 * r + 3 * i) % 150)).collect();
        let b: Vec<String> = (0..1 + (3 * r) % 5).map(|i| format!("w{}", (11 * r + 5 * i + 1) % 150)).collect();
        s += &format!("{}\t{}\t{}\t{}\t{}\n", (r * 5 / 3) % 2, 2 * r, 2 * r + 1, a.join(" "), b.join(" "));
    }
    std::fs::write(path, s).unwrap();
}

fn megatron(args: &[&str]) {
    let cli = megatron::cli::Cli::try_parse_from(std::iter::once("megatron").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("{e}"));
    megatron::cli::run(cli).unwrap();
}

#[test]
fn first_finetune_step_equals_transformers() {
    let Some(py) = python() else {
        eprintln!("SKIP first_finetune_step_equals_transformers: no python with torch + transformers at /work/venv/bin/python (set MEGATRON_PYTHON)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (hf, ckpt, tsv, dump) =
        (dir.path().join("hf"), dir.path().join("ckpt"), dir.path().join("train.tsv"), dir.path().join("step.st"));
    write_tiny_hf_bert(&hf, 5);
    write_tsv(&tsv);
    let s = |p: &Path| p.to_str().unwrap().to_string();
    megatron(&["import", "hf", "--hf-dir", &s(&hf), "--save", &s(&ckpt)]);
    megatron(&[
        "finetune",
        "--task",
        "MRPC",
        "--train-data",
        &s(&tsv),
        "--valid-data",
        &s(&tsv),
        "--load",
        &s(&ckpt),
        "--micro-batch-size",
        "8",
        "--seq-length",
        "16",
        "--lr",
        "1e-3",
        "--lr-warmup-fraction",
        "0",
        "--hidden-dropout",
        "0",
        "--attention-dropout",
        "0",
        "--epochs",
        "3",
        "--dump-first-step",
        &s(&dump),
        "--dump-steps",
        "3",
    ]);
    let out =
        Command::new(&py).arg(root().join("scripts/bert_finetune_step_check.py")).args([&dump, &hf]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    assert!(out.status.success(), "the first step differs from transformers:\n{text}");
}
