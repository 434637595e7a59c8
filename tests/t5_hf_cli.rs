//! `megatron import hf`, `generate` and `export hf` for T5 on tiny random
//! `T5ForConditionalGeneration`s (3 encoder / 2 decoder layers) saved by transformers'
//! `save_pretrained`: T5 v1.0 style (ReLU, scaled tied head; `tests/fixtures/hf_t5_relu_tiny`)
//! and T5 v1.1 style (gated GeLU, unscaled head; `tests/fixtures/hf_t5_v11_tiny`), made by
//! `scripts/t5_hf_cli_check.py make DIR [v11]`: the imported checkpoint's logits equal transformers'
//! within 1e-4 relative, `megatron generate` (KV cache, and the full recompute) prints
//! transformers' greedy tokens, and the export gives back every tensor bit for bit; with
//! /work/venv (or $MEGATRON_PYTHON) transformers also loads the export and its logits are
//! identical. Also `megatron data inspect --model t5` on tiny Shakespeare (when
//! `../shared/data` is present).

mod common;

use megatron::generate::t5::load_t5;
use megatron::generate::LoadArgs;
use megatron::hf::export::ExportHfArgs;
use megatron::hf::import::ImportHfArgs;
use megatron_core::{Model, Registry};
use safetensors::SafeTensors;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf_t5_relu_tiny")
}

fn fixture_v11() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf_t5_v11_tiny")
}

fn ints(v: &Value) -> Vec<i32> {
    v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap() as i32).collect()
}

fn load_args(ckpt: &Path) -> LoadArgs {
    LoadArgs { load: ckpt.to_path_buf(), backend: "cpu".into(), ..LoadArgs::default() }
}

fn generate_cli(ckpt: &Path, prompt: &str, extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_megatron"))
        .args(["generate", "--load"])
        .arg(ckpt)
        .args(["--prompt", prompt, "--top-k", "1", "--tokens-to-generate", "10"])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "generate failed: {}", String::from_utf8_lossy(&out.stderr));
    eprintln!("{}", String::from_utf8_lossy(&out.stderr).trim());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn t5_import_generate_export_match_transformers() {
    check_fixture(&fixture(), "relu");
}

/// T5 v1.1 style: gated GeLU, no `d_model^-0.5` before the head (`scale_decoder_outputs: false`).
#[test]
fn t5_v11_import_generate_export_match_transformers() {
    check_fixture(&fixture_v11(), "gated-gelu");
}

fn check_fixture(fx: &Path, ffn: &str) {
    let fx = fx.to_path_buf();
    let exp: Value = serde_json::from_str(&std::fs::read_to_string(fx.join("expected.json")).unwrap()).unwrap();
    let (enc, dec, greedy) = (ints(&exp["input_ids"]), ints(&exp["decoder_input_ids"]), ints(&exp["greedy"]));
    let tmp = tempfile::tempdir().unwrap();
    let (ckpt, out) = (tmp.path().join("ckpt"), tmp.path().join("export"));
    let registry = Registry::builtin().unwrap();
    let import = ImportHfArgs { hf_dir: fx.clone(), save: ckpt.clone(), make_vocab_size_divisible_by: 128 };
    megatron::hf::import::run(&import, &registry).unwrap();

    // Logits of the imported checkpoint.
    let mut loaded = load_t5(&registry, &load_args(&ckpt), enc.len(), dec.len()).unwrap();
    let tokens: Vec<i32> = enc.iter().chain(&dec).copied().collect();
    let be = loaded.model.backend();
    let logits = be.to_host(&loaded.model.logits(&tokens, 1, tokens.len()).unwrap()).unwrap().to_f32_vec();
    let want: Vec<f64> = exp["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()))
        .collect();
    assert_eq!(logits.len(), want.len());
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
    let worst = logits.iter().zip(&want).map(|(&g, &w)| (g as f64 - w).abs()).fold(0f64, f64::max);
    println!("t5 {ffn} import: max |logit| {scale:.3}, worst abs diff {worst:.3e} ({:.3e} relative)", worst / scale);
    assert!(worst <= 1e-4 * scale);
    assert_eq!((loaded.decoder_start, loaded.eos), (0, Some(1)));

    // `megatron generate`: the prompt is ids (the fixture has no tokenizer.json: NullTokenizer).
    let prompt = enc.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(" ");
    let expected = greedy[1..].iter().map(|t| t.to_string()).collect::<Vec<_>>().join(" ");
    assert_eq!(generate_cli(&ckpt, &prompt, &[]), expected, "cached generation differs from transformers");
    assert_eq!(generate_cli(&ckpt, &prompt, &["--no-kv-cache"]), expected, "full recompute differs");

    // Export: every tensor of transformers' file back, bit for bit.
    let export = ExportHfArgs { load: load_args(&ckpt), out: out.clone(), dtype: None };
    megatron::hf::export::run(&export, &registry).unwrap();
    let (a, b) =
        (std::fs::read(fx.join("model.safetensors")).unwrap(), std::fs::read(out.join("model.safetensors")).unwrap());
    let (sa, sb) = (SafeTensors::deserialize(&a).unwrap(), SafeTensors::deserialize(&b).unwrap());
    let mut names: Vec<&String> = sa.names();
    names.sort();
    let mut got: Vec<&String> = sb.names();
    got.sort();
    assert_eq!(names, got);
    for n in names {
        let (x, y) = (sa.tensor(n).unwrap(), sb.tensor(n).unwrap());
        assert_eq!((x.dtype(), x.shape()), (y.dtype(), y.shape()), "{n}");
        assert!(x.data() == y.data(), "{n} differs");
    }
    println!("export: {} tensors bit-identical; whole file identical: {}", sa.len(), a == b);
    let cfg: Value = serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["feed_forward_proj"], ffn);
    assert_eq!(cfg["num_decoder_layers"], 2);

    // transformers loads the export and computes identical logits.
    let python = std::env::var("MEGATRON_PYTHON").unwrap_or_else(|_| "/work/venv/bin/python".into());
    if !Path::new(&python).exists() {
        println!("skipping the transformers load of the export: no python at {python} (set MEGATRON_PYTHON)");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/t5_hf_cli_check.py");
    let r = Command::new(&python).arg(script).arg("check").arg(&fx).arg(&out).output().unwrap();
    let stderr = String::from_utf8_lossy(&r.stderr);
    if !r.status.success() && stderr.contains("ModuleNotFoundError") {
        println!("skipping the transformers load of the export: {python} lacks torch/transformers");
        return;
    }
    assert!(r.status.success(), "transformers check failed:\n{stderr}");
    println!("{}", String::from_utf8_lossy(&r.stdout).trim());
}

/// A directory that is not a T5 layout megatron-rs knows is refused with the tensor's name.
#[test]
fn t5_import_refuses_unknown_tensors() {
    let fx = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("hf");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(fx.join("config.json"), dir.join("config.json")).unwrap();
    let bytes = std::fs::read(fx.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::tensor::TensorView)> =
        st.names().into_iter().map(|n| (n.clone(), st.tensor(n).unwrap())).collect();
    let extra = st.tensor("encoder.final_layer_norm.weight").unwrap();
    tensors.push(("encoder.final_layer_norm.bias".into(), extra));
    std::fs::write(dir.join("model.safetensors"), safetensors::serialize(tensors, &None).unwrap()).unwrap();
    let registry = Registry::builtin().unwrap();
    let import = ImportHfArgs { hf_dir: dir, save: tmp.path().join("ckpt"), make_vocab_size_divisible_by: 128 };
    let err = format!("{:#}", megatron::hf::import::run(&import, &registry).unwrap_err());
    assert!(err.contains("encoder.final_layer_norm.bias"), "{err}");
}

/// `megatron data inspect --model t5`: samples decoded with their sentinels, and the masked
/// fraction over 2000 samples near the configured 0.15.
#[test]
fn t5_data_inspect_shows_span_corruption_samples() {
    let Some(data) = common::shared_data() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let prefix = tmp.path().join("shakespeare");
    let vocab = data.join("bert-base-uncased/vocab.txt");
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_megatron")).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let (input, vocab, prefix) =
        (data.join("tinyshakespeare.jsonl"), vocab.to_str().unwrap().to_string(), prefix.to_str().unwrap().to_string());
    run(&[
        "preprocess",
        "--input",
        input.to_str().unwrap(),
        "--output-prefix",
        &prefix,
        "--tokenizer-type",
        "BertWordPieceLowerCase",
        "--vocab-file",
        &vocab,
        "--split-sentences",
        "--workers",
        "1",
    ]);
    let report = run(&[
        "data",
        "inspect",
        &format!("{prefix}_text_sentence"),
        "--model",
        "t5",
        "--seq-length",
        "64",
        "--decoder-seq-length",
        "24",
        "--tokenizer-type",
        "BertWordPieceLowerCase",
        "--vocab-file",
        &vocab,
        "--vocab-extra-ids",
        "100",
        "--show",
        "2",
        "--stats",
        "2000",
    ]);
    println!("{report}");
    assert!(report.contains("encoder    [CLS]") && report.contains("<extra_id_0>"), "{report}");
    assert!(report.contains("labels     <extra_id_0>") && report.contains("[EOS]"), "{report}");
    let frac: f64 = report
        .split("masked fraction ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no masked fraction in {report}"));
    assert!((0.12..=0.16).contains(&frac), "masked fraction {frac}");

    // A `megatron pretrain --model t5` checkpoint (learned positions, BERT tokenizer with
    // sentinels) generates through the cache the same text as through the full recompute.
    let ckpt = tmp.path().join("ckpt");
    let ckpt = ckpt.to_str().unwrap();
    #[rustfmt::skip]
    run(&[
        "pretrain", "--model", "t5", "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
        "--seq-length", "32", "--decoder-seq-length", "16", "--max-position-embeddings", "32",
        "--micro-batch-size", "2", "--global-batch-size", "2", "--train-iters", "2", "--lr", "1e-3",
        "--data-path", &format!("{prefix}_text_sentence"), "--split", "98,2,0", "--eval-iters", "0",
        "--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", &vocab, "--vocab-extra-ids", "100",
        "--save", ckpt, "--save-interval", "2",
    ]);
    let gen = |extra: &[&str]| {
        let mut a = vec!["generate", "--load", ckpt, "--prompt", "to be or not to be", "--top-k", "1"];
        a.extend(["--tokens-to-generate", "8"]);
        a.extend(extra);
        run(&a)
    };
    let cached = gen(&[]);
    assert!(!cached.trim().is_empty());
    assert_eq!(cached, gen(&["--no-kv-cache"]));
}
