//! Hugging Face GPT-2 import/export against `shared/data/hf_gpt2_tiny` (made with
//! transformers): imported logits, loss and greedy continuation (through the kv cache) match
//! `reference.json`, and exporting the imported checkpoint gives back every tensor bit for bit.

mod common;

use megatron::generate::{load_model, GenerationParams, Generator, LoadArgs, SamplingParams};
use megatron::hf::export::ExportHfArgs;
use megatron::hf::import::ImportHfArgs;
use megatron_core::{Model, Registry};
use safetensors::SafeTensors;
use serde_json::Value;
use std::path::Path;

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

fn ints(v: &Value) -> Vec<i32> {
    v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap() as i32).collect()
}

/// `max |ours - ref| / max |ref|`.
fn rel_err(ours: &[f64], reference: &[f64]) -> f64 {
    let scale = reference.iter().fold(0f64, |m, x| m.max(x.abs()));
    ours.iter().zip(reference).fold(0f64, |m, (a, b)| m.max((a - b).abs())) / scale
}

fn logsumexp(x: &[f32]) -> f64 {
    let m = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    m + x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln()
}

fn import(fixture: &Path, save: &Path, registry: &Registry) {
    let args =
        ImportHfArgs { hf_dir: fixture.to_path_buf(), save: save.to_path_buf(), make_vocab_size_divisible_by: 128 };
    megatron::hf::import::run(&args, registry).unwrap();
}

#[test]
fn imported_hf_gpt2_matches_reference_and_exports_bit_identically() {
    let Some(data) = common::shared_data() else { return };
    check_against_transformers(&data.join("hf_gpt2_tiny"), &data);
}

/// The same checks on any GPT-2 directory whose `reference.json` was written by
/// `shared/tools/hf_check.py check --dir DIR > DIR/reference.json` (transformers). Used once
/// to check a model trained with `megatron pretrain` and exported with `megatron export hf`:
/// `MEGATRON_HF_CHECK_DIR=DIR cargo test --test hf_roundtrip -- --nocapture`.
#[test]
fn exported_model_matches_transformers_when_given() {
    let Some(dir) = std::env::var_os("MEGATRON_HF_CHECK_DIR") else {
        println!("skipping: set MEGATRON_HF_CHECK_DIR to an exported GPT-2 directory with a reference.json");
        return;
    };
    let Some(data) = common::shared_data() else { return };
    check_against_transformers(Path::new(&dir), &data);
}

fn check_against_transformers(fixture: &Path, data: &Path) {
    let fixture = fixture.to_path_buf();
    let reference: Value = serde_json::from_slice(&std::fs::read(fixture.join("reference.json")).unwrap()).unwrap();
    let registry = Registry::builtin().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("ckpt");
    import(&fixture, &ckpt, &registry);
    let mut loaded =
        load_model(&registry, &LoadArgs { load: ckpt.clone(), backend: "cpu".into(), ..Default::default() }).unwrap();
    assert_eq!(loaded.model.padded_vocab_size(), 50304);
    assert_eq!(loaded.vocab_size, 50257);
    let v = loaded.vocab_size;

    // Prompt logits (the tokenizer recorded by the import gives the reference ids).
    let prompt = reference["prompt"].as_str().unwrap();
    let ids: Vec<i32> = loaded.tokenizer.encode(prompt).unwrap().iter().map(|&t| t as i32).collect();
    assert_eq!(ids, ints(&reference["prompt_ids"]));
    let t = ids.len();
    let logits = loaded.model.logits(&ids, 1, t).unwrap();
    let logits = loaded.model.backend().to_host(&logits).unwrap().to_f32_vec();
    let vp = logits.len() / t;
    let last = &logits[(t - 1) * vp..(t - 1) * vp + v];
    let first10: Vec<f64> = last[..10].iter().map(|&x| x as f64).collect();
    let err = rel_err(&first10, &floats(&reference["last_logits_first10"]));
    assert!(err < 1e-4, "last-position logits differ: rel err {err:.3e}");
    let mut order: Vec<usize> = (0..v).collect();
    order.sort_by(|&a, &b| last[b].total_cmp(&last[a]));
    let top5: Vec<i32> = order[..5].iter().map(|&i| i as i32).collect();
    assert_eq!(top5, ints(&reference["last_top5_ids"]));
    let top5_logits: Vec<f64> = order[..5].iter().map(|&i| last[i] as f64).collect();
    assert!(rel_err(&top5_logits, &floats(&reference["last_top5_logits"])) < 1e-4);
    let lse = logsumexp(last);
    let want_lse = reference["last_logsumexp"].as_f64().unwrap();
    assert!(((lse - want_lse) / want_lse).abs() < 1e-4, "logsumexp {lse} vs {want_lse}");

    // Mean next-token loss on the first 128 tokens of tinyshakespeare (HF: labels = inputs).
    let text = std::fs::read_to_string(data.join(reference["text_file"].as_str().unwrap())).unwrap();
    let head: String = text.chars().take(2000).collect();
    let n = reference["text_tokens"].as_u64().unwrap() as usize;
    let toks: Vec<i32> = loaded.tokenizer.encode(&head).unwrap()[..n].iter().map(|&t| t as i32).collect();
    let logits = loaded.model.logits(&toks, 1, n).unwrap();
    let logits = loaded.model.backend().to_host(&logits).unwrap().to_f32_vec();
    let loss: f64 = (0..n - 1)
        .map(|i| {
            let row = &logits[i * vp..i * vp + v];
            logsumexp(row) - row[toks[i + 1] as usize] as f64
        })
        .sum::<f64>()
        / (n - 1) as f64;
    let want_loss = reference["text_loss"].as_f64().unwrap();
    println!("loss ours {loss:.6} hf {want_loss:.6}");
    assert!(((loss - want_loss) / want_loss).abs() < 1e-4, "loss {loss} vs {want_loss}");

    // Greedy continuation through the kv cache, and without it.
    let greedy = ints(&reference["greedy_ids"]);
    for use_kv_cache in [true, false] {
        let params = GenerationParams {
            tokens_to_generate: greedy.len(),
            sampling: SamplingParams::greedy(),
            stop_tokens: vec![loaded.eod],
            use_kv_cache,
            ..Default::default()
        };
        let mut gen = Generator { model: &mut loaded.model, vocab_size: v, pad_id: loaded.eod };
        let out = gen.generate(std::slice::from_ref(&ids), &params, &mut |_, _| true).unwrap();
        assert_eq!(&out.tokens[0][t..], &greedy[..], "greedy continuation (kv cache {use_kv_cache})");
    }

    // Export back: every tensor bit-identical, tokenizer files copied, config consistent.
    let out = tmp.path().join("hf_out");
    let args = ExportHfArgs {
        load: LoadArgs { load: ckpt, backend: "cpu".into(), ..Default::default() },
        out: out.clone(),
        dtype: None,
    };
    megatron::hf::export::run(&args, &registry).unwrap();
    let (a, b) = (
        std::fs::read(fixture.join("model.safetensors")).unwrap(),
        std::fs::read(out.join("model.safetensors")).unwrap(),
    );
    let (orig, ours) = (SafeTensors::deserialize(&a).unwrap(), SafeTensors::deserialize(&b).unwrap());
    let mut names: Vec<String> = orig.names().into_iter().cloned().collect();
    let mut our_names: Vec<String> = ours.names().into_iter().cloned().collect();
    names.sort();
    our_names.sort();
    assert_eq!(names, our_names);
    for name in &names {
        let (x, y) = (orig.tensor(name).unwrap(), ours.tensor(name).unwrap());
        assert_eq!((x.dtype(), x.shape()), (y.dtype(), y.shape()), "{name}");
        assert!(x.data() == y.data(), "bytes of {name} differ");
    }
    for f in ["vocab.json", "merges.txt"] {
        assert!(std::fs::read(fixture.join(f)).unwrap() == std::fs::read(out.join(f)).unwrap(), "{f}");
    }
    let cfg: Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    for key in ["vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "tie_word_embeddings"] {
        assert_eq!(cfg[key], reference["config"][key], "config.json `{key}`");
    }
    assert!(out.join("generation_config.json").exists());
    // The export refuses to overwrite.
    let err = megatron::hf::export::run(&args, &registry).unwrap_err().to_string();
    assert!(err.contains("already exists"), "{err}");
}
