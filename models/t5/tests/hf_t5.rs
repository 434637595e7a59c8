//! A tiny random Hugging Face `T5ForConditionalGeneration` (relative positions, gated GeLU,
//! RMS norms, no biases, tied head with its scaling; fixture from
//! `scripts/t5_hf_fixture.py`): imported into T5Model, its logits for an input / decoder-input
//! pair equal transformers' within 1e-4 relative, and greedy generation gives the same tokens.

use megatron_core::{Backend, Model, ParallelContext};
use megatron_cpu::CpuBackend;
use megatron_t5::hf::{load_hf_t5, t5_config_from_hf};
use megatron_t5::T5Model;
use safetensors::SafeTensors;
use std::path::PathBuf;
use std::sync::Arc;

#[test]
fn hf_t5_logits_match_transformers() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf_t5_tiny");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let ints = |k: &str| exp[k].as_array().unwrap().iter().map(|v| v.as_i64().unwrap() as i32).collect::<Vec<_>>();
    let (enc, dec) = (ints("input_ids"), ints("decoder_input_ids"));
    let c = t5_config_from_hf(&cfg, enc.len(), dec.len()).unwrap();
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut m = T5Model::new(c, be.clone(), ParallelContext::single()).unwrap();
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let get = |name: &str| -> anyhow::Result<(Vec<usize>, Vec<f32>)> {
        let t = st.tensor(name).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        let v = t.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        Ok((t.shape().to_vec(), v))
    };
    load_hf_t5(&mut m, &get).unwrap();
    let tokens: Vec<i32> = enc.iter().chain(&dec).copied().collect();
    let logits = be.to_host(&m.logits(&tokens, 1, tokens.len()).unwrap()).unwrap().to_f32_vec();
    let want: Vec<f64> = exp["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()))
        .collect();
    assert_eq!(logits.len(), want.len());
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
    let worst = logits.iter().zip(&want).map(|(&g, &w)| (g as f64 - w).abs()).fold(0f64, f64::max);
    println!("max |logit| {scale:.3}, worst abs diff {worst:.3e}, relative {:.3e}", worst / scale);
    assert!(worst <= 1e-4 * scale, "logits differ: worst {worst:.3e} of max {scale:.3}");
}

#[test]
fn hf_t5_greedy_generation_matches_transformers() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf_t5_tiny");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let ints = |k: &str| exp[k].as_array().unwrap().iter().map(|v| v.as_i64().unwrap() as i32).collect::<Vec<_>>();
    let (enc, want) = (ints("input_ids"), ints("greedy"));
    let c = t5_config_from_hf(&cfg, enc.len(), 9).unwrap();
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut m = T5Model::new(c, be, ParallelContext::single()).unwrap();
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let get = |name: &str| -> anyhow::Result<(Vec<usize>, Vec<f32>)> {
        let t = st.tensor(name).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        let v = t.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        Ok((t.shape().to_vec(), v))
    };
    load_hf_t5(&mut m, &get).unwrap();
    let got = megatron_t5::generate::greedy(&mut m, &enc, 0, Some(1), 8).unwrap();
    assert_eq!(got, want);
}

/// Import then export gives back every tensor of the file bit for bit (names, shapes, values).
#[test]
fn hf_t5_export_round_trips_bit_identically() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf_t5_tiny");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let c = t5_config_from_hf(&cfg, 9, 6).unwrap();
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut m = T5Model::new(c, be, ParallelContext::single()).unwrap();
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let get = |name: &str| -> anyhow::Result<(Vec<usize>, Vec<f32>)> {
        let t = st.tensor(name).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        let v = t.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        Ok((t.shape().to_vec(), v))
    };
    load_hf_t5(&mut m, &get).unwrap();
    let exported = megatron_t5::hf::export_hf_t5(&m).unwrap();
    let mut names: Vec<String> = st.names().into_iter().cloned().collect();
    names.sort();
    let mut got: Vec<String> = exported.iter().map(|t| t.0.clone()).collect();
    got.sort();
    assert_eq!(got, names);
    for (name, shape, values) in &exported {
        let (s, v) = get(name).unwrap();
        assert_eq!(&s, shape, "{name}");
        assert!(v.iter().zip(values).all(|(a, b)| a.to_bits() == b.to_bits()), "{name} differs");
    }
}

/// The cached decoding (encoder once, KV caches) gives transformers' greedy tokens too.
#[test]
fn hf_t5_cached_greedy_matches_transformers() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf_t5_tiny");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let ints = |k: &str| exp[k].as_array().unwrap().iter().map(|v| v.as_i64().unwrap() as i32).collect::<Vec<_>>();
    let (enc, want) = (ints("input_ids"), ints("greedy"));
    // Sequence lengths are not structural with relative positions: any will do.
    let c = t5_config_from_hf(&cfg, 4, 4).unwrap();
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut m = T5Model::new(c, be, ParallelContext::single()).unwrap();
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let get = |name: &str| -> anyhow::Result<(Vec<usize>, Vec<f32>)> {
        let t = st.tensor(name).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        let v = t.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        Ok((t.shape().to_vec(), v))
    };
    load_hf_t5(&mut m, &get).unwrap();
    let got = megatron_t5::decode::greedy_cached(&mut m, &enc, 0, Some(1), 8).unwrap();
    assert_eq!(got, want);
}

/// An untied head (`lm_head.weight`, T5 v1.1 checkpoints saved before transformers 5) exports
/// under its own name and imports back into the same parameters, bit for bit. (transformers
/// 5.x always ties T5's head, so there is no transformers oracle for this layout here.)
#[test]
fn hf_t5_untied_head_round_trips() {
    let mut c = t5_config_from_hf(
        &serde_json::json!({
            "d_model": 16, "d_kv": 4, "d_ff": 24, "num_layers": 1, "num_heads": 4, "vocab_size": 30,
            "relative_attention_num_buckets": 8, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": false
        }),
        5,
        4,
    )
    .unwrap();
    assert!(c.untie_embeddings_and_output_weights && c.output_scale.is_none());
    c.init_method_std = 0.5;
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let m = T5Model::new(c.clone(), be.clone(), ParallelContext::single()).unwrap();
    let tensors = megatron_t5::hf::export_hf_t5(&m).unwrap();
    let head = tensors.iter().find(|t| t.0 == "lm_head.weight").expect("lm_head.weight exported");
    let shared = tensors.iter().find(|t| t.0 == "shared.weight").unwrap();
    assert_ne!(head.2, shared.2);
    c.seed += 1; // different initial weights, all overwritten by the import
    let mut back = T5Model::new(c, be.clone(), ParallelContext::single()).unwrap();
    let get = |name: &str| -> anyhow::Result<(Vec<usize>, Vec<f32>)> {
        let t = tensors.iter().find(|t| t.0 == name).ok_or_else(|| anyhow::anyhow!("no {name}"))?;
        Ok((t.1.clone(), t.2.clone()))
    };
    load_hf_t5(&mut back, &get).unwrap();
    for (a, b) in m.params().iter().zip(back.params()) {
        assert_eq!(a.name, b.name);
        let (x, y) = (be.to_host(&a.value).unwrap().to_f32_vec(), be.to_host(&b.value).unwrap().to_f32_vec());
        assert!(x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()), "{} differs", a.name);
    }
}
