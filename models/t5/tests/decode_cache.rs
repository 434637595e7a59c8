//! Cached decoding (encoder once, cross-attention K/V once per layer, self-attention KV cache)
//! against the full recompute: the logits of every step equal those of one uncached forward
//! over the whole decoder row, and greedy decoding picks the same tokens, for Megatron's
//! configuration (learned positions, LayerNorm, GeLU, biases) and the Hugging Face style one
//! (relative position buckets, RMSNorm, gated GeLU, no biases, scaled tied head).

mod common;

use common::{config, hf_style, model, SD, SE};
use megatron_core::Model;
use megatron_t5::decode::{argmax, decode_with, greedy_cached};
use megatron_t5::generate::greedy;
use megatron_t5::T5Config;

fn check(c: T5Config) {
    let vocab = c.vocab_size;
    let mut m = model(c);
    let enc: Vec<i32> = (0..SE).map(|i| ((i * 11 + 3) % vocab) as i32).collect();
    let mut steps: Vec<Vec<f32>> = Vec::new();
    let dec = decode_with(
        &mut m,
        &enc,
        0,
        &[],
        SD - 1,
        &mut |row| {
            steps.push(row.to_vec());
            Ok(argmax(row))
        },
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(dec.len(), SD);
    // One uncached forward over the generated row gives every step's logits at once.
    let tokens: Vec<i32> = enc.iter().chain(&dec).copied().collect();
    let be = m.backend();
    let full = be.to_host(&m.logits(&tokens, 1, SE + SD).unwrap()).unwrap().to_f32_vec();
    let width = full.len() / SD;
    let mut worst = 0f32;
    for (t, got) in steps.iter().enumerate() {
        let want = &full[t * width..t * width + vocab];
        let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = got.iter().zip(want).fold(0f32, |a, (g, w)| a.max((g - w).abs()));
        assert!(d <= 1e-5 * scale.max(1.0), "step {t}: cached logits differ by {d:e} (max |logit| {scale})");
        worst = worst.max(d);
    }
    println!("worst |cached - uncached| logit over {} steps: {worst:e}", steps.len());
    assert_eq!(greedy(&mut m, &enc, 0, None, SD - 1).unwrap(), dec, "greedy tokens differ");
    // Early stop at an end token: stops right after emitting it.
    let eos = dec[2];
    let stopped = greedy_cached(&mut m, &enc, 0, Some(eos), SD - 1).unwrap();
    assert_eq!(stopped.last(), Some(&eos));
    assert_eq!(stopped[..], dec[..stopped.len()]);
}

#[test]
fn cached_decoding_equals_full_recompute_megatron_config() {
    check(config());
}

#[test]
fn cached_decoding_equals_full_recompute_hf_config() {
    check(hf_style());
}

#[test]
fn cached_decoding_with_several_decoder_layers() {
    let mut c = hf_style();
    c.decoder_num_layers = 3;
    check(c);
}
