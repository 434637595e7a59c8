//! `megatron bench`: training throughput of a GPT configuration on a backend, reported as
//! tokens/s, achieved model GFLOP/s (`6·N_matmul + 12·L·T·h` FLOPs per token, the llm.c /
//! PaLM convention) and its ratio to the backend's own fp32 GEMM rate measured in the same
//! run, plus a per-op profile and the peak RSS. Release builds only for numbers.

pub mod comm;
mod profile;
#[cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]
pub mod serve;

use anyhow::{bail, Context, Result};
use clap::Args;
use megatron_core::registry::ModelEnv;
use megatron_core::{Backend, Batch, DType, GemmSpec, HostBuffer, Mode, ParallelContext, Registry};
use profile::ProfilingBackend;
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// `megatron bench serve ...`: the serving load generator (see `bench serve --help`).
    #[command(subcommand)]
    pub what: Option<BenchWhat>,
    /// `tiny` (4 layers, 256 hidden, 4 heads, seq 256, micro batch 8, GPT-2 vocab) or
    /// `gpt2-124m` (12/768/12, seq 1024, micro batch 4, vocab padded to 50304).
    #[arg(long, default_value = "tiny")]
    pub preset: String,
    /// Timed training iterations (after the warm-up ones).
    #[arg(long, default_value_t = 5)]
    pub iters: usize,
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    #[arg(long)]
    pub threads: Option<usize>,
    /// Also run the iterations through the timing decorator and print the per-op profile.
    #[arg(long)]
    pub profile: bool,
    /// bf16 parameters and activations with fp32 main parameters in the optimizer (the
    /// `pretrain --bf16` step).
    #[arg(long)]
    pub bf16: bool,
}

/// Other benchmarks than training throughput.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum BenchWhat {
    #[cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]
    /// Continuous vs static batching of `megatron serve` under concurrent loopback clients.
    Serve(serve::ServeBenchArgs),
    /// Time and bus bandwidth of the collectives of any communicator (threads or MPI ranks).
    Comm(comm::CommBenchArgs),
    /// Token sampling by selection against sorting the whole vocabulary (the serving engine's
    /// per-token cost; same tokens checked).
    #[cfg(feature = "gpt")]
    Sampling(SamplingBenchArgs),
}

#[derive(Args, Debug, Clone)]
pub struct SamplingBenchArgs {
    /// Tokens sampled per setting and logit scale (each way).
    #[arg(long, default_value_t = 200)]
    pub iters: usize,
}

struct Preset {
    layers: usize,
    hidden: usize,
    heads: usize,
    seq: usize,
    mbs: usize,
    vocab: usize,
}

fn preset(name: &str) -> Result<Preset> {
    Ok(match name {
        "tiny" => Preset { layers: 4, hidden: 256, heads: 4, seq: 256, mbs: 8, vocab: 50257 },
        "gpt2-124m" => Preset { layers: 12, hidden: 768, heads: 12, seq: 1024, mbs: 4, vocab: 50257 },
        other => bail!("unknown --preset `{other}`: expected `tiny` or `gpt2-124m`"),
    })
}

/// fp32 GEMM rate of `backend` on `m×n×k` (best of a few repetitions), GFLOP/s.
pub fn gemm_gflops(backend: &dyn Backend, m: usize, n: usize, k: usize, spec_t: (bool, bool)) -> Result<f64> {
    let a = backend.from_host(HostBuffer::F32((0..m * k).map(|i| (i % 7) as f32 * 0.01).collect()), &[m * k])?;
    let b = backend.from_host(HostBuffer::F32((0..k * n).map(|i| (i % 5) as f32 * 0.01).collect()), &[k * n])?;
    let mut c = backend.zeros(&[m * n], DType::F32)?;
    let spec = GemmSpec { m, n, k, trans_a: spec_t.0, trans_b: spec_t.1, alpha: 1.0, beta: 0.0 };
    backend.gemm(&a, &b, &mut c, spec, None)?;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        backend.gemm(&a, &b, &mut c, spec, None)?;
        backend.synchronize()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(2.0 * (m * n * k) as f64 / best / 1e9)
}

/// Peak resident set size of this process in MiB (Linux `VmHWM`).
pub fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

pub fn run(args: &BenchArgs, registry: &Registry) -> Result<()> {
    if let Some(BenchWhat::Comm(a)) = &args.what {
        return comm::run(a, registry);
    }
    #[cfg(feature = "gpt")]
    if let Some(BenchWhat::Sampling(a)) = &args.what {
        for line in megatron_serving::sampling::bench::run(a.iters)? {
            println!("{line}");
        }
        return Ok(());
    }
    #[cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]
    if let Some(BenchWhat::Serve(a)) = &args.what {
        return serve::run(a, registry);
    }
    let p = preset(&args.preset)?;
    let raw = registry.backend(&args.backend, json!({ "threads": args.threads }))?;
    let profiler = Arc::new(ProfilingBackend::new(raw.clone()));
    let backend: Arc<dyn Backend> = if args.profile { profiler.clone() } else { raw.clone() };
    let padded = p.vocab.div_ceil(128) * 128;
    let mut model_cfg = json!({
        "num_layers": p.layers, "hidden_size": p.hidden, "num_attention_heads": p.heads,
        "seq_length": p.seq, "max_position_embeddings": p.seq, "vocab_size": p.vocab,
        "hidden_dropout": 0.0, "attention_dropout": 0.0, "seed": 1234,
    });
    if args.bf16 {
        model_cfg["params_dtype"] = json!(DType::BF16);
    }
    let env = ModelEnv { backend: backend.clone(), ctx: ParallelContext::single(), mlp: None };
    let mut model = registry.model("gpt", model_cfg, &env).context("building the benchmark model")?;
    let mut optimizer = registry.optimizer("adam", json!({}))?;
    if args.bf16 {
        optimizer = mixed_precision(optimizer)?;
    }
    let n_tokens = p.mbs * p.seq;
    let tokens: Vec<i32> = (0..n_tokens).map(|i| ((i * 7919) % p.vocab) as i32).collect();
    let labels: Vec<i32> = (0..n_tokens).map(|i| ((i * 104_729 + 1) % p.vocab) as i32).collect();
    let batch =
        Batch { micro_batch_size: p.mbs, seq_length: p.seq, tokens, labels, loss_mask: vec![1.0; n_tokens], seed: 7 };

    let (l, h, t) = (p.layers as f64, p.hidden as f64, p.seq as f64);
    let n_matmul = l * 12.0 * h * h + padded as f64 * h;
    let flops_per_token = 6.0 * n_matmul + 12.0 * l * t * h;
    println!(
        "bench {}{}: {} layers, hidden {}, heads {}, seq {}, micro batch {}, padded vocab {}, backend {}, threads {}",
        args.preset,
        if args.bf16 { " (bf16)" } else { "" },
        p.layers,
        p.hidden,
        p.heads,
        p.seq,
        p.mbs,
        padded,
        raw.name(),
        args.threads.map(|t| t.to_string()).unwrap_or_else(|| "all".into())
    );
    let mut step = |model: &mut Box<dyn megatron_core::Model>| -> Result<f64> {
        model.zero_grad()?;
        let rep = model.forward(&batch, Mode::Train)?;
        model.backward(1.0 / rep.num_tokens as f32)?;
        let mut params = model.params_mut();
        optimizer.step(&mut params, 1e-4, 0.1, backend.as_ref())?;
        Ok(rep.loss_sum / rep.num_tokens)
    };
    for _ in 0..args.warmup {
        step(&mut model)?;
    }
    profiler.reset();
    // This machine's speed drifts (shared host): every timed step is paired with a GEMM-rate
    // sample taken right after it, and the ratio is the median of the per-pair ratios.
    let bt = p.mbs * p.seq;
    let (gm, gn, gk) = (bt, 4 * p.hidden, p.hidden);
    let (mut step_secs, mut gemm_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut loss = 0.0;
    for _ in 0..args.iters.max(1) {
        let t0 = Instant::now();
        loss = step(&mut model)?;
        backend.synchronize()?;
        let secs = t0.elapsed().as_secs_f64();
        let rate = gemm_gflops(raw.as_ref(), gm, gn, gk, (false, true))?;
        ratios.push(n_tokens as f64 * flops_per_token / secs / 1e9 / rate);
        step_secs.push(secs);
        gemm_rates.push(rate);
    }
    let secs = median(&mut step_secs);
    let tok_s = n_tokens as f64 / secs;
    let model_gflops = tok_s * flops_per_token / 1e9;
    let gemm = median(&mut gemm_rates);
    let spread = |v: &[f64], digits: usize| {
        let (lo, hi) = (v.iter().cloned().fold(f64::MAX, f64::min), v.iter().cloned().fold(0.0, f64::max));
        format!("{lo:.digits$}..{hi:.digits$}")
    };
    println!(
        "  step time            {:.1} ms (median of {} iterations, last loss {:.4})",
        secs * 1e3,
        args.iters,
        loss
    );
    println!("  tokens/s             {tok_s:.0}");
    println!("  model GFLOP/s        {model_gflops:.1}  ({:.3e} FLOPs/token = 6*N_matmul + 12*L*T*h)", flops_per_token);
    println!(
        "  fp32 GEMM GFLOP/s    {gemm:.1}  (median, range {}; backend gemm {gm}x{gn}x{gk} NT after each step)",
        spread(&gemm_rates, 1)
    );
    println!(
        "  ratio to GEMM        {:.3}  (median of per-step ratios, range {})",
        median(&mut ratios),
        spread(&ratios, 3)
    );
    let params: usize = model.params().iter().map(|p| p.value.numel()).sum();
    println!(
        "  parameters           {params} ({:.1} MiB fp32; params+grads+Adam m,v = {:.1} MiB)",
        mib(params * 4),
        mib(params * 16)
    );
    if let Some(rss) = peak_rss_mib() {
        println!("  peak RSS             {rss:.1} MiB");
    }
    if args.profile {
        let rows = profiler.report();
        let total: f64 = rows.iter().map(|r| r.2).sum();
        println!("  per-op profile ({} iterations, op time with a synchronize after each):", args.iters);
        for (op, calls, s) in rows.iter().filter(|r| r.2 > 0.0) {
            let per_iter = s / args.iters.max(1) as f64 * 1e3;
            let gflops = op
                .strip_prefix("gemm ")
                .and_then(|shape| shape.split(' ').next())
                .map(|mnk| mnk.split('x').filter_map(|d| d.parse::<f64>().ok()).product::<f64>())
                .map(|mnk| format!("{:>7.1} GFLOP/s", 2.0 * mnk * *calls as f64 / s / 1e9))
                .unwrap_or_default();
            println!(
                "    {op:<32} {calls:>6} calls {per_iter:>9.2} ms/iter {:>6.1} % {gflops}",
                100.0 * s / total.max(1e-12)
            );
        }
    }
    Ok(())
}

/// The `pretrain --bf16` optimizer: fp32 main parameters around `inner`.
#[cfg(feature = "optim")]
fn mixed_precision(inner: Box<dyn megatron_core::Optimizer>) -> Result<Box<dyn megatron_core::Optimizer>> {
    Ok(Box::new(megatron_optim::MixedPrecisionOptimizer::new(inner)))
}

#[cfg(not(feature = "optim"))]
fn mixed_precision(_: Box<dyn megatron_core::Optimizer>) -> Result<Box<dyn megatron_core::Optimizer>> {
    bail!("bench --bf16 needs the `optim` feature (fp32 main parameters)")
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
