//! Micro-benchmark of `sampling::sample` (top-p and plain temperature by a growing partial
//! selection, top-k by selection) against `sampling::sample_full_sort` (sorting the whole
//! vocabulary), on GPT-2-sized logits (V = 50257), both in the same run, same logits, same seeds;
//! also checks that both pick the same tokens.
//!
//! `cargo run --release -p megatron-serving --example sampling_bench [iters]`
//!
//! Logits: uniform in ±scale; scale 1 is an untrained model (nearly flat: a top-p 0.9 nucleus
//! holds most of the vocabulary), scale 12 a peaked one (a trained model's typical spread).

use megatron_serving::sampling::{sample, sample_full_sort, SamplingParams};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

fn main() {
    let iters: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(200);
    let v = 50257;
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    println!("setting | logits scale | full sort us/token | fast us/token | full/fast");
    for scale in [1.0f32, 4.0, 12.0] {
        // A few different logit vectors per setting, cycled.
        let rows: Vec<Vec<f32>> =
            (0..8).map(|_| (0..v).map(|_| (rng.gen::<f32>() - 0.5) * 2.0 * scale).collect()).collect();
        let settings = [
            ("top_p 0.9", SamplingParams { top_p: 0.9, ..SamplingParams::default() }),
            ("top_p 0.5 t 0.7", SamplingParams { top_p: 0.5, temperature: 0.7, ..SamplingParams::default() }),
            ("temperature 1.0", SamplingParams::default()),
            ("temperature 0.7", SamplingParams { temperature: 0.7, ..SamplingParams::default() }),
            ("top_k 40", SamplingParams { top_k: 40, ..SamplingParams::default() }),
        ];
        for (name, p) in settings {
            let time = |f: &dyn Fn(&[f32], &mut ChaCha8Rng) -> usize| {
                let mut r = ChaCha8Rng::seed_from_u64(7);
                let t0 = Instant::now();
                let toks: Vec<usize> = (0..iters).map(|i| f(&rows[i % rows.len()], &mut r)).collect();
                (t0.elapsed().as_secs_f64() * 1e6 / iters as f64, toks)
            };
            let (full_us, full_toks) = time(&|l, r| sample_full_sort(l, &p, p.top_p, r));
            let (fast_us, fast_toks) = time(&|l, r| sample(l, &p, p.top_p, r));
            assert_eq!(full_toks, fast_toks, "{name} scale {scale}: the fast path picked other tokens");
            println!("{name} | {scale} | {full_us:.0} | {fast_us:.0} | {:.2}x", full_us / fast_us);
        }
    }
}
