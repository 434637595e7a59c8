//! `RopeScaling::inv_freq` against the frequencies Hugging Face transformers computes
//! (`core/tests/fixtures/rope_scaling_inv_freq.json`, written by
//! `scripts/llama_variants_fixture.py`): llama3 (Llama-3.1 and 3.2 constants, and a small
//! original context where all three bands occur), linear and unscaled. Both sides are f32;
//! the tolerance (2e-7 relative, about two ulps) allows for a different `powf`.

use megatron_core::{RopeScaling, RotarySpec};
use serde_json::Value;

fn scaling(v: &Value) -> RopeScaling {
    let f = |k: &str| v[k].as_f64().unwrap() as f32;
    match v["rope_type"].as_str().unwrap() {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: f("factor") },
        "llama3" => RopeScaling::Llama3 {
            factor: f("factor"),
            low_freq_factor: f("low_freq_factor"),
            high_freq_factor: f("high_freq_factor"),
            original_max_position_embeddings: v["original_max_position_embeddings"].as_u64().unwrap() as usize,
        },
        other => panic!("fixture has rope type {other}"),
    }
}

#[test]
fn inv_freq_matches_transformers() {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/rope_scaling_inv_freq.json"))
            .unwrap();
    let cases: Vec<Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(cases.len(), 5);
    for case in &cases {
        let s = scaling(&case["rope_scaling"]);
        s.validate().unwrap();
        let theta = case["rope_theta"].as_f64().unwrap() as f32;
        let dim = case["head_dim"].as_u64().unwrap() as usize;
        let want: Vec<f64> = case["inv_freq"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let got = s.inv_freq(theta, dim);
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let rel = (*g as f64 - w).abs() / w.abs();
            assert!(rel <= 2e-7, "{s:?} theta {theta} dim {dim}: inv_freq[{i}] = {g}, transformers {w} (rel {rel:e})");
        }
        if !s.is_none() {
            // Scaling changes something: the test would fail on a no-op.
            assert_ne!(got, RopeScaling::None.inv_freq(theta, dim), "{s:?}");
        }
    }
}

#[test]
fn bad_parameters_are_clear_errors() {
    assert!(RopeScaling::Linear { factor: 0.0 }.validate().unwrap_err().to_string().contains("factor"));
    let e = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 4.0,
        high_freq_factor: 1.0,
        original_max_position_embeddings: 8192,
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(e.contains("high_freq_factor"), "{e}");
}

/// The host rotation with `RopeScaling::None` frequencies is the plain rotation, and with
/// linear factor `f` at position `p` it equals the plain one at position `p / f`.
#[test]
fn host_rotation_follows_the_frequencies() {
    let spec = RotarySpec {
        batch: 1,
        seq: 1,
        heads: 1,
        head_dim: 4,
        rotary_dim: 4,
        base: 10000.0,
        interleaved: false,
        position_offset: 8,
    };
    let x0: Vec<f32> = (0..12).map(|i| i as f32 * 0.25 - 1.0).collect();
    let mut scaled = x0.clone();
    let lin = RopeScaling::Linear { factor: 2.0 };
    megatron_core::rope_scaling::rotary_host(&mut scaled, &spec, &lin.inv_freq(10000.0, 4), false).unwrap();
    let mut plain = x0.clone();
    let at4 = RotarySpec { position_offset: 4, ..spec };
    megatron_core::rope_scaling::rotary_host(&mut plain, &at4, &RopeScaling::None.inv_freq(10000.0, 4), false).unwrap();
    for (a, b) in scaled.iter().zip(&plain) {
        assert!((a - b).abs() < 1e-6, "{scaled:?} vs {plain:?}");
    }
    assert_eq!(&scaled[8..], &x0[8..], "v is left alone");
    // Inverse undoes the rotation.
    megatron_core::rope_scaling::rotary_host(&mut scaled, &spec, &lin.inv_freq(10000.0, 4), true).unwrap();
    for (a, b) in scaled.iter().zip(&x0) {
        assert!((a - b).abs() < 1e-6);
    }
}
