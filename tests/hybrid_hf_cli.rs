//! `megatron import hf`, `generate` and `export hf` for Mamba-2 (issue 18) on a tiny random
//! transformers `Mamba2ForCausalLM` (2 layers, 4 heads x 16, state 8, 2 groups, vocab 64;
//! `tests/fixtures/hf_mamba2_tiny`, made by `scripts/hf_mamba2_fixture.py DIR`, with the
//! logits of transformers' slow pure-PyTorch path and its greedy tokens in `reference.json`):
//! the imported checkpoint's logits equal transformers' within 1e-4 relative, `megatron
//! generate` prints transformers' greedy tokens (recurrent state, and the full recompute), and
//! the export gives back every tensor bit for bit and the same config.

use megatron::generate::hybrid::load_hybrid;
use megatron::generate::LoadArgs;
use megatron_core::{Model, Registry};
use safetensors::SafeTensors;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf_mamba2_tiny")
}

fn cli(args: &[&str], paths: &[&Path]) -> (String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_megatron"));
    cmd.args(args);
    for p in paths {
        cmd.arg(p);
    }
    let out = cmd.output().unwrap();
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string());
    assert!(out.status.success(), "megatron {args:?} failed: {stderr}");
    (stdout, stderr)
}

/// The ids `megatron generate` reports on stderr (`...; ids [a, b, ...]`).
fn generated_ids(stderr: &str) -> Vec<i32> {
    let list = stderr.rsplit("ids [").next().unwrap().split(']').next().unwrap();
    list.split(',').filter(|s| !s.trim().is_empty()).map(|s| s.trim().parse().unwrap()).collect()
}

#[test]
fn mamba2_import_generate_export_match_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, out) = (dir.path().join("ckpt"), dir.path().join("export"));
    let reference: Value = serde_json::from_slice(&std::fs::read(fixture().join("reference.json")).unwrap()).unwrap();
    let mut cmd_args = vec!["import", "hf", "--save"];
    cmd_args.push(ckpt.to_str().unwrap());
    cmd_args.push("--hf-dir");
    cli(&cmd_args, &[&fixture()]);

    // Logits of the imported checkpoint vs transformers' slow path.
    let registry = Registry::builtin().unwrap();
    let mut loaded =
        load_hybrid(&registry, &LoadArgs { load: ckpt.clone(), backend: "cpu".into(), ..LoadArgs::default() }).unwrap();
    assert_eq!(loaded.model.name(), "mamba");
    let tokens: Vec<Vec<i32>> = serde_json::from_value(reference["tokens"].clone()).unwrap();
    let want: Vec<f32> = serde_json::from_value(reference["logits"].clone()).unwrap();
    let flat: Vec<i32> = tokens.concat();
    let logits = loaded.model.logits(&flat, tokens.len(), tokens[0].len()).unwrap();
    let got = loaded.model.backend().to_host(&logits).unwrap().to_f32_vec();
    assert_eq!(got.len(), want.len(), "vocabulary is not padded on import");
    let max = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let err = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / max;
    eprintln!("imported logits vs transformers: max |diff| / max |logit| = {err:.2e}");
    assert!(err < 1e-4, "logits differ by {err:.2e} relative");

    // Greedy generation through the CLI: recurrent state, then the full recompute.
    let prompt_len = reference["prompt_len"].as_u64().unwrap() as usize;
    let generated: Vec<Vec<i32>> = serde_json::from_value(reference["generated"].clone()).unwrap();
    for (row, want) in tokens.iter().zip(&generated) {
        let prompt: Vec<String> = row[..prompt_len].iter().map(|t| t.to_string()).collect();
        let prompt = prompt.join(" ");
        let n = want.len().to_string();
        for extra in [&[][..], &["--no-kv-cache"][..]] {
            let mut a = vec!["generate", "--prompt", &prompt, "--top-k", "1", "--tokens-to-generate", &n];
            a.extend_from_slice(extra);
            a.push("--load");
            let (_, stderr) = cli(&a, &[&ckpt]);
            assert_eq!(&generated_ids(&stderr), want, "prompt {prompt} {extra:?}: {stderr}");
        }
    }

    // Export: the same tensors, bit for bit, and the same config.
    cli(&["export", "hf", "--out", out.to_str().unwrap(), "--load"], &[&ckpt]);
    let (a, b) = (
        std::fs::read(fixture().join("model.safetensors")).unwrap(),
        std::fs::read(out.join("model.safetensors")).unwrap(),
    );
    let (orig, back) = (SafeTensors::deserialize(&a).unwrap(), SafeTensors::deserialize(&b).unwrap());
    let mut names: Vec<&String> = orig.names();
    names.sort();
    let mut back_names: Vec<&String> = back.names();
    back_names.sort();
    assert_eq!(names, back_names);
    for name in names {
        let (x, y) = (orig.tensor(name).unwrap(), back.tensor(name).unwrap());
        assert_eq!(x.shape(), y.shape(), "{name}");
        assert_eq!(x.data(), y.data(), "{name} is not bit-identical");
    }
    let cfg = |d: &Path| -> Value { serde_json::from_slice(&std::fs::read(d.join("config.json")).unwrap()).unwrap() };
    let (c0, c1) = (cfg(&fixture()), cfg(&out));
    for key in ["num_heads", "head_dim", "state_size", "n_groups", "hidden_size", "num_hidden_layers", "vocab_size"] {
        assert_eq!(c0[key], c1[key], "config.json `{key}`");
    }
}
