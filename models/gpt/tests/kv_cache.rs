//! Incremental decoding with the kv cache against full recomputation: the logits of every
//! position must agree within 1e-5 (relative to the largest logit), for a batch of rows, with
//! a multi-token prefill followed by single tokens, and after a cache reset.

mod common;

use common::*;
use megatron_core::Model;

fn max_rel_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, &x| m.max(x.abs() as f64));
    a.iter().zip(b).fold(0f64, |m, (&x, &y)| m.max((x as f64 - y as f64).abs())) / scale
}

#[test]
fn cached_decoding_matches_full_recompute() {
    check_cached_decoding(tiny_config(50, 11));
}

#[test]
fn cached_llama_decoding_with_rope_and_gqa_matches_full_recompute() {
    check_cached_decoding(tiny_llama_config(50, 11));
}

fn check_cached_decoding(c: megatron_gpt::GptConfig) {
    let (b, t, vocab) = (3, c.seq_length, c.vocab_size);
    let mut model = tiny_model(c);
    let tokens = batch(b, t, vocab, 5).tokens;
    let full = model.logits(&tokens, b, t).unwrap();
    let full = model.backend().to_host(&full).unwrap().to_f32_vec();
    let v = model.padded_vocab_size();

    let mut cache = model.new_kv_cache(b, t).unwrap();
    for _round in 0..2 {
        cache.reset();
        let mut pos = 0;
        for n in [4, 1, 2, 1, 1, 1, 1] {
            let step: Vec<i32> = (0..b).flat_map(|r| tokens[r * t + pos..r * t + pos + n].to_vec()).collect();
            let got = model.forward_cached(&step, &mut cache).unwrap();
            assert_eq!(got.len(), b * n * v);
            let want: Vec<f32> = (0..b).flat_map(|r| full[(r * t + pos) * v..(r * t + pos + n) * v].to_vec()).collect();
            let err = max_rel_diff(&got, &want);
            assert!(err < 1e-5, "positions {pos}..{}: cached vs full logits differ by {err:.3e}", pos + n);
            pos += n;
        }
        assert_eq!(cache.len(), t);
    }
    let err = model.forward_cached(&tokens[..b], &mut cache).unwrap_err().to_string();
    assert!(err.contains("exceed the kv cache capacity"), "{err}");
}

#[test]
fn cache_longer_than_positions_is_rejected() {
    let model = tiny_model(tiny_config(50, 8));
    let err = model.new_kv_cache(1, 9).err().expect("capacity 9 > 8 positions").to_string();
    assert!(err.contains("max_position_embeddings"), "{err}");
}
