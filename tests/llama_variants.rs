//! Rope scaling and q/k layernorms on Hugging Face models made with transformers
//! (`scripts/llama_variants_fixture.py`): a Llama with llama3 rope scaling (all three
//! frequency bands), GQA and an untied head, and a Qwen3 (per-head q/k RMSNorms = our
//! `--qk-layernorm`, linear rope scaling, tied head). `megatron import hf` must give
//! transformers' logits (1e-5 of the largest logit: f32 both sides), kv-cache decoding the
//! same greedy tokens as full recompute, and `megatron export hf` every tensor back bit for bit
//! with the same rotary settings in config.json.

use megatron::generate::{load_model, GenerationParams, Generator, LoadArgs, SamplingParams};
use megatron::hf::export::ExportHfArgs;
use megatron::hf::import::ImportHfArgs;
use megatron_core::{Model, Registry, RopeScaling};
use safetensors::SafeTensors;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn check(name: &str, want_scaling: RopeScaling, want_qk: bool, want_type: &str) {
    let dir = fixture(name);
    let reference: Value = serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let registry = Registry::builtin().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("ckpt");
    let args = ImportHfArgs { hf_dir: dir.clone(), save: ckpt.clone(), make_vocab_size_divisible_by: 128 };
    megatron::hf::import::run(&args, &registry).unwrap();
    let load = LoadArgs { load: ckpt.clone(), backend: "cpu".into(), ..Default::default() };
    let mut loaded = load_model(&registry, &load).unwrap();
    assert_eq!(loaded.model.config().rope_scaling, want_scaling, "{name}");
    assert_eq!(loaded.model.config().qk_layernorm, want_qk, "{name}");

    let ids: Vec<i32> = reference["input_ids"].as_array().unwrap().iter().map(|x| x.as_i64().unwrap() as i32).collect();
    let t = ids.len();
    let logits = loaded.model.logits(&ids, 1, t).unwrap();
    let logits = loaded.model.backend().to_host(&logits).unwrap().to_f32_vec();
    let vp = logits.len() / t;
    for (p, row) in reference["positions"].as_array().unwrap().iter().zip(reference["logits"].as_array().unwrap()) {
        let p = p.as_u64().unwrap() as usize;
        let want: Vec<f64> = row.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let scale = want.iter().fold(0f64, |m, x| m.max(x.abs()));
        let err = want.iter().enumerate().fold(0f64, |m, (i, w)| m.max((logits[p * vp + i] as f64 - w).abs())) / scale;
        assert!(err < 1e-5, "{name}: logits at position {p} differ from transformers by {err:.2e} of the largest");
    }

    // Decoding through the kv cache (rotation at cached offsets) = full recompute.
    let prompt = ids[..20].to_vec();
    let mut outs = Vec::new();
    for use_kv_cache in [true, false] {
        let params = GenerationParams {
            tokens_to_generate: 12,
            sampling: SamplingParams::greedy(),
            use_kv_cache,
            ..Default::default()
        };
        let vocab = loaded.vocab_size;
        let mut gen = Generator { model: &mut loaded.model, vocab_size: vocab, pad_id: loaded.eod };
        outs.push(gen.generate(std::slice::from_ref(&prompt), &params, &mut |_, _| true).unwrap().tokens[0].clone());
    }
    assert_eq!(outs[0], outs[1], "{name}: greedy tokens with and without the kv cache");

    let out = tmp.path().join("hf_out");
    let args = ExportHfArgs { load, out: out.clone(), dtype: None };
    megatron::hf::export::run(&args, &registry).unwrap();
    same_tensors(&dir.join("model.safetensors"), &out.join("model.safetensors"));
    let cfg: Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["model_type"], want_type, "{name}");
    let (theta, scaling) = megatron_gpt::hf_rope::rope_from_hf_config(&cfg, "export").unwrap();
    let orig: Value = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!((theta, scaling), megatron_gpt::hf_rope::rope_from_hf_config(&orig, "fixture").unwrap(), "{name}");
}

fn same_tensors(a: &Path, b: &Path) {
    let (a, b) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
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
}

#[test]
fn llama3_rope_scaling_matches_transformers_and_round_trips() {
    let scaling = RopeScaling::Llama3 {
        factor: 4.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 32,
    };
    check("hf_llama3_scaled", scaling, false, "llama");
}

#[test]
fn qwen3_qk_layernorm_matches_transformers_and_round_trips() {
    check("hf_qwen3_qknorm", RopeScaling::Linear { factor: 2.0 }, true, "qwen3");
}
