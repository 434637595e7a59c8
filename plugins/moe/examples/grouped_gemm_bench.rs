//! Grouped GEMM vs a per-expert loop of GEMM calls: the experts' forward + backward (4
//! matmuls forward... 6 in all) on the tiny config's shapes (hidden 256, micro-batch 8 x seq
//! 256 = 2048 tokens, top-2 → 4096 rows, SwiGLU expert FFN 512), rows spread over E experts
//! with a fixed uneven pattern. Both variants run in the same process, interleaved, on the
//! same backend; prints the median time of each and the ratio.
//!
//! `cargo run --release -p megatron-moe --example grouped_gemm_bench -- [threads]`

use megatron_core::{Backend, HostBuffer};
use megatron_cpu::CpuBackend;
use megatron_moe::experts::{ExpertSaved, Experts};
use std::sync::Arc;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let threads: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(2);
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::with_threads(threads)?);
    let (hidden, ffn, rows) = (256usize, 512usize, 4096usize);
    for experts in [8usize, 64] {
        // Uneven but fixed loads: weights 1..=E, normalised to `rows`.
        let total: usize = (1..=experts).sum();
        let mut sizes: Vec<usize> = (1..=experts).map(|w| w * rows / total).collect();
        sizes[0] += rows - sizes.iter().sum::<usize>();
        let make = |grouped| {
            Experts::new(backend.clone(), "bench", (0, experts), (hidden, ffn), (0, 1), true, grouped, (0.02, 0.02, 1))
        };
        let mut variants = [make(true)?, make(false)?];
        let x: Vec<f32> = (0..rows * hidden).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        let dz = x.clone();
        let mut times = [Vec::new(), Vec::new()];
        for rep in 0..7 {
            for (v, ex) in variants.iter_mut().enumerate() {
                let xt = backend.from_host(HostBuffer::F32(x.clone()), &[rows, hidden])?;
                let mut saved = ExpertSaved::empty(backend.as_ref())?;
                let t0 = Instant::now();
                ex.forward(xt, vec![1.0; rows], &sizes, &mut saved)?;
                ex.backward(&saved, &dz)?;
                if rep > 0 {
                    times[v].push(t0.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
        let median = |t: &mut Vec<f64>| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        };
        let (g, l) = (median(&mut times[0]), median(&mut times[1]));
        println!(
            "experts {experts:3}: grouped GEMM {g:8.2} ms, per-expert loop {l:8.2} ms, loop/grouped = {:.2}x \
             (fwd+bwd, {rows} rows, hidden {hidden}, ffn {ffn}, {threads} threads)",
            l / g
        );
    }
    Ok(())
}
