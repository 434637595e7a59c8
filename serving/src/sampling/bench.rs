//! `megatron bench sampling`: [`super::sample`] (top-p and plain temperature by a growing
//! partial selection, top-k by selection) against [`super::sample_full_sort`] (sorting the whole
//! vocabulary) on GPT-2-sized logits (V = 50257): both in the same run, on the same logits with
//! the same seeds, and both must pick the same tokens.
//!
//! Logits are uniform in ±scale: scale 1 is like an untrained model (nearly flat, so a top-p 0.9
//! nucleus holds most of the vocabulary and a temperature draw walks far), scale 12 a peaked one.

use super::{sample, sample_full_sort, SamplingParams};
use anyhow::{bail, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

/// Runs `iters` tokens per setting and scale; returns the table's lines (markdown).
pub fn run(iters: usize) -> Result<Vec<String>> {
    let v = 50257;
    let iters = iters.max(1);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut out = vec![
        "| setting | logits scale | full sort us/token | selection us/token | full / selection |".to_string(),
        "|---|---|---|---|---|".to_string(),
    ];
    for scale in [1.0f32, 4.0, 12.0] {
        let rows: Vec<Vec<f32>> =
            (0..8).map(|_| (0..v).map(|_| (rng.gen::<f32>() - 0.5) * 2.0 * scale).collect()).collect();
        let settings = [
            ("top_p 0.9", SamplingParams { top_p: 0.9, ..SamplingParams::default() }),
            ("top_p 0.5, t 0.7", SamplingParams { top_p: 0.5, temperature: 0.7, ..SamplingParams::default() }),
            ("temperature 1", SamplingParams::default()),
            ("temperature 0.7", SamplingParams { temperature: 0.7, ..SamplingParams::default() }),
            ("top_k 40", SamplingParams { top_k: 40, ..SamplingParams::default() }),
        ];
        for (name, p) in settings {
            let time = |fast: bool| {
                let mut r = ChaCha8Rng::seed_from_u64(7);
                let t0 = Instant::now();
                let toks: Vec<usize> = (0..iters)
                    .map(|i| {
                        let l = &rows[i % rows.len()];
                        if fast {
                            sample(l, &p, p.top_p, &mut r)
                        } else {
                            sample_full_sort(l, &p, p.top_p, &mut r)
                        }
                    })
                    .collect();
                (t0.elapsed().as_secs_f64() * 1e6 / iters as f64, toks)
            };
            let (full_us, full_toks) = time(false);
            let (fast_us, fast_toks) = time(true);
            if full_toks != fast_toks {
                bail!("{name}, scale {scale}: the selection path picked other tokens than the full sort");
            }
            out.push(format!("| {name} | {scale} | {full_us:.0} | {fast_us:.0} | {:.2}x |", full_us / fast_us));
        }
    }
    Ok(out)
}
