//! `megatron plan`: the `pretrain` flags in, the planner's per-stage memory, FLOPs and step
//! time out (the `megatron-plan` crate), without building a model. The rates the step time
//! needs are measured now unless given: the GEMM rate on the chosen backend with the threads
//! one rank would get, at the shape of the model's MLP GEMM (`--gemm-gflops`); the payload
//! rate and per-call latency of an all-reduce among the largest group of the layout on the
//! `local` communicator, ranks as threads as in `pretrain --nproc` (`--comm-gbps`,
//! `--comm-latency-us`); and one thread's memory streaming rate (`--mem-gbps`).

use crate::args::PretrainArgs;
use crate::config::TrainConfig;
use anyhow::{bail, Context, Result};
use clap::Args;
use megatron_core::Registry;
use megatron_core::{DType, Group, ReduceOp};
use megatron_plan::step_time::{Contention, Rates};
use megatron_plan::{report, PlanInput, Precision, Recompute};
use serde_json::json;
use std::time::Instant;

#[derive(Args, Clone, Debug)]
pub struct PlanArgs {
    #[command(flatten)]
    pub pretrain: PretrainArgs,
    /// Memory the run may use, in bytes or with a K/M/G/T suffix (default: this machine's
    /// limit, as the memory check of `pretrain` reads it).
    #[arg(long)]
    pub memory_budget: Option<String>,
    /// GEMM rate of one rank in GFLOP/s (default: measured on --backend now).
    #[arg(long)]
    pub gemm_gflops: Option<f64>,
    /// Communicator payload rate in GB/s of an all-reduce among the layout's largest group
    /// (default: measured now on the `local` communicator, ranks as threads).
    #[arg(long)]
    pub comm_gbps: Option<f64>,
    /// Fixed cost of one communicator call in microseconds (default: measured now).
    #[arg(long)]
    pub comm_latency_us: Option<f64>,
    /// Memory streaming rate of one rank in GB/s, for the optimizer step (default: measured).
    #[arg(long)]
    pub mem_gbps: Option<f64>,
    /// One rank's GEMM rate while all ranks that fit on the cores run GEMMs at once, as a
    /// fraction of its rate alone (1 = ranks do not slow each other; default: measured now
    /// when the layout has several ranks).
    #[arg(long)]
    pub concurrent_gemm_ratio: Option<f64>,
}

/// `"24G"`, `"512M"`, `"1073741824"` → bytes (binary units).
pub fn parse_bytes(s: &str) -> Result<u128> {
    let t = s.trim();
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1u128 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        Some('T') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let v: f64 =
        num.trim().parse().with_context(|| format!("--memory-budget `{s}`: expected e.g. 24G, 512M or bytes"))?;
    if !(v > 0.0 && v.is_finite()) {
        bail!("--memory-budget `{s}` must be positive");
    }
    Ok((v * mult as f64) as u128)
}

/// The planner's input for the `gpt` model of `cfg`.
pub fn plan_input(cfg: &TrainConfig, vocab_size: usize) -> Result<PlanInput> {
    let a = &cfg.args;
    if a.model != "gpt" {
        bail!("megatron plan knows the shapes of the `gpt` model only (got --model {})", a.model);
    }
    if a.moe.num_experts.is_some() {
        bail!("megatron plan does not know mixture-of-experts layers (--num-experts); plan the dense model");
    }
    let padded = cfg.padded_vocab(vocab_size);
    let mut gpt: megatron_gpt::GptConfig =
        serde_json::from_value(cfg.model_config(vocab_size)).context("model flags do not form a GPT config")?;
    gpt.padded_vocab_size = Some(padded);
    let heads = gpt.num_attention_heads;
    let recompute = match a.recompute_granularity.as_deref() {
        Some("full") => {
            if a.recompute_method.as_deref() != Some("uniform") || a.recompute_num_layers.unwrap_or(1) != 1 {
                bail!(
                    "megatron plan models full recomputation with --recompute-method uniform \
                     --recompute-num-layers 1 only (every layer keeps its input, one layer is rebuilt at a time)"
                );
            }
            Recompute::Full
        }
        Some(_) => Recompute::Selective,
        None if a.recompute_activations => Recompute::Selective,
        None => Recompute::None,
    };
    Ok(PlanInput {
        num_layers: gpt.num_layers,
        hidden: gpt.hidden_size,
        heads,
        query_groups: gpt.num_query_groups.unwrap_or(heads),
        kv_channels: gpt.kv_channels.unwrap_or(gpt.hidden_size / heads.max(1)),
        ffn: gpt.ffn_hidden_size(),
        swiglu: gpt.swiglu,
        padded_vocab: padded,
        max_position_embeddings: gpt.max_position_embeddings,
        learned_positions: !gpt.uses_rope(),
        untied: gpt.untie_embeddings_and_output_weights,
        seq: a.seq_length,
        micro_batch: a.micro_batch_size,
        num_microbatches: cfg.num_microbatches,
        tp: a.tensor_model_parallel_size.max(1),
        pp: a.pipeline_model_parallel_size.max(1),
        dp: cfg.data_parallel_size.max(1),
        virtual_pp: 1,
        optimizer_floats: if a.optimizer == "sgd" { 1 } else { 2 },
        distributed_optimizer: a.use_distributed_optimizer,
        precision: if a.bf16 || a.fp16 { Precision::Half } else { Precision::Fp32 },
        recompute,
        // The reducer's rule (plugins/parallel/src/ddp.rs): one bucket unless overlapping or
        // sized; Megatron's default size max(40M, 1M x dp x cp) with overlap.
        bucket_elems: match (a.overlap_grad_reduce, a.ddp_bucket_size) {
            (_, Some(b)) => Some(b),
            (true, None) => {
                Some(40_000_000usize.max(1_000_000 * cfg.data_parallel_size.max(1) * a.context_parallel_size.max(1)))
            }
            (false, None) => None,
        },
        fp32_residual: gpt.fp32_residual_connection,
        rms_norm: gpt.normalization == megatron_transformer::NormKind::RMSNorm,
        sequence_parallel: a.sequence_parallel && a.tensor_model_parallel_size > 1,
        cp: a.context_parallel_size.max(1),
    })
}

/// The vocabulary size `pretrain` would use (the tokenizer's, or `--vocab-size` with mock data).
fn vocab_size(cfg: &TrainConfig, registry: &Registry) -> Result<usize> {
    Ok(match (&cfg.tokenizer_type, cfg.args.tokenizer.vocab_size) {
        (Some(t), _) => registry
            .tokenizer(t, cfg.tokenizer_config())
            .with_context(|| format!("building tokenizer {t} (for the vocabulary size)"))?
            .vocab_size(),
        (None, Some(v)) => v,
        (None, None) => bail!("--mock-data without --tokenizer-type needs --vocab-size"),
    })
}

/// The line `pretrain` prints at the end of a run whose ranks are all threads of this process:
/// the plan's predicted process peak next to the measured peak RSS. `None` for models the
/// planner does not know (or off Linux).
pub fn peak_report(cfg: &TrainConfig, registry: &Registry) -> Option<String> {
    let input = plan_input(cfg, vocab_size(cfg, registry).ok()?).ok()?;
    let predicted = megatron_plan::plan(&input).process_bytes();
    let measured = (crate::bench::peak_rss_mib()? * (1u64 << 20) as f64) as u128;
    Some(format!(
        " > memory: plan predicted peak {} (megatron plan), measured peak RSS {} (VmHWM), predicted/measured {:.3}",
        report::human(predicted),
        report::human(measured),
        predicted as f64 / measured as f64
    ))
}

pub fn run(args: &PlanArgs, registry: &Registry) -> Result<()> {
    let a = &args.pretrain;
    let cfg = TrainConfig::from_args(a, a.nproc)?;
    let input = plan_input(&cfg, vocab_size(&cfg, registry)?)?;
    let budget = match &args.memory_budget {
        Some(s) => parse_bytes(s)?,
        None => crate::train::memory::machine_memory().map_or(u128::MAX, |m| m.limit),
    };
    let world = input.tp * input.pp * input.dp;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = (cores / world).max(1);
    // At the shape of the model's first MLP GEMM (tokens x F/tp x C), where most FLOPs go.
    let shape = ((input.micro_batch * input.seq).clamp(64, 4096), (input.ffn / input.tp).max(64), input.hidden);
    let rate = match args.gemm_gflops {
        Some(g) => g * 1e9,
        None => {
            let backend = registry.backend(&a.backend, json!({ "threads": threads }))?;
            crate::bench::gemm_gflops(backend.as_ref(), shape.0, shape.1, shape.2, (false, true))? * 1e9
        }
    };
    let concurrent_ratio = match args.concurrent_gemm_ratio {
        Some(r) if r > 0.0 && r <= 1.0 => r,
        Some(r) => bail!("--concurrent-gemm-ratio {r} must lie in (0, 1]"),
        // The ranks that fit on the cores at once (time-slicing beyond them is modelled).
        None if world > 1 => {
            let fit = (cores / threads).clamp(1, world);
            let alone = concurrent_gemm_seconds(registry, &a.backend, 1, threads, shape)?;
            let together = concurrent_gemm_seconds(registry, &a.backend, fit, threads, shape)?;
            (alone / together).min(1.0)
        }
        None => 1.0,
    };
    let contention = Contention { cores, threads_per_rank: threads, concurrent_ratio };
    // The largest group whose collectives the step waits on (2 at least: a one-rank layout
    // communicates nothing, and the rate is then unused).
    let group = input.tp.max(input.dp).max(input.pp).max(2);
    let (comm_rate, latency) = match (args.comm_gbps, args.comm_latency_us) {
        (Some(g), Some(l)) => (g * 1e9, l * 1e-6),
        (g, l) => {
            let (mg, ml) = measure_all_reduce(registry, &a.backend, group, threads)?;
            (g.map_or(mg, |g| g * 1e9), l.map_or(ml, |l| l * 1e-6))
        }
    };
    let mem = match args.mem_gbps {
        Some(g) => g * 1e9,
        None => measure_stream_bytes_per_s(),
    };
    let rates =
        Rates { gemm_flops_per_s: rate, comm_bytes_per_s: comm_rate, comm_latency_s: latency, mem_bytes_per_s: mem };
    print!("{}", report::render_shared(&input, Some(rates), &contention, budget));
    Ok(())
}

/// Seconds the slowest of `ranks` threads (each a backend with `threads` threads) takes for 6
/// GEMMs of `shape` `(m, n, k)` when all start together (after one warm-up GEMM each).
fn concurrent_gemm_seconds(
    registry: &Registry,
    backend: &str,
    ranks: usize,
    threads: usize,
    (m, n, k): (usize, usize, usize),
) -> Result<f64> {
    use megatron_core::{GemmSpec, HostBuffer};
    let start = std::sync::Barrier::new(ranks);
    let times: Vec<Result<f64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..ranks)
            .map(|_| {
                let start = &start;
                s.spawn(move || -> Result<f64> {
                    let b = registry.backend(backend, json!({ "threads": threads }))?;
                    let x =
                        b.from_host(HostBuffer::F32((0..m * k).map(|i| (i % 7) as f32 * 0.01).collect()), &[m * k])?;
                    let w =
                        b.from_host(HostBuffer::F32((0..k * n).map(|i| (i % 5) as f32 * 0.01).collect()), &[k * n])?;
                    let mut c = b.zeros(&[m * n], DType::F32)?;
                    let spec = GemmSpec { m, n, k, trans_a: false, trans_b: true, alpha: 1.0, beta: 0.0 };
                    b.gemm(&x, &w, &mut c, spec, None)?;
                    start.wait();
                    let t = Instant::now();
                    for _ in 0..6 {
                        b.gemm(&x, &w, &mut c, spec, None)?;
                    }
                    b.synchronize()?;
                    Ok(t.elapsed().as_secs_f64())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a bench rank panicked"))))
            .collect()
    });
    let mut worst = 0f64;
    for t in times {
        worst = worst.max(t.context("measuring concurrent GEMMs (megatron plan)")?);
    }
    Ok(worst)
}

/// Payload bytes/s and per-call seconds of an all-reduce (sum, fp32) among `ranks` thread ranks
/// of the `local` communicator on `backend`: the best of a few 16 MiB calls (minus the
/// latency) and the best of many 4-element calls.
fn measure_all_reduce(registry: &Registry, backend: &str, ranks: usize, threads: usize) -> Result<(f64, f64)> {
    const BIG: usize = 4 << 20;
    let comms = registry.communicators("local", json!({ "timeout_secs": 60 }), ranks)?;
    let group = Group::new("plan-bench", (0..ranks).collect());
    let timings: Vec<Result<(f64, f64)>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|comm| {
                let group = &group;
                s.spawn(move || -> Result<(f64, f64)> {
                    let b = registry.backend(backend, json!({ "threads": threads }))?;
                    let mut small = b.zeros(&[4], DType::F32)?;
                    let mut big = b.zeros(&[BIG], DType::F32)?;
                    let mut best_small = f64::MAX;
                    for _ in 0..50 {
                        let t = Instant::now();
                        comm.all_reduce(group, &mut small, ReduceOp::Sum)?;
                        best_small = best_small.min(t.elapsed().as_secs_f64());
                    }
                    let mut best_big = f64::MAX;
                    for _ in 0..4 {
                        comm.barrier(group)?;
                        let t = Instant::now();
                        comm.all_reduce(group, &mut big, ReduceOp::Sum)?;
                        b.synchronize()?;
                        best_big = best_big.min(t.elapsed().as_secs_f64());
                    }
                    Ok((best_small, best_big))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a bench rank panicked"))))
            .collect()
    });
    let (mut small, mut big) = (0f64, 0f64);
    for t in timings {
        let (s, b) = t.context("measuring the communicator (megatron plan)")?;
        // The slowest rank: a collective ends for the group when its last member is done.
        small = small.max(s);
        big = big.max(b);
    }
    Ok(((BIG * 4) as f64 / (big - small).max(1e-9), small))
}

/// One thread's memory streaming rate, bytes/s: `c = a + b` over 3 x 64 MiB (best of 3).
fn measure_stream_bytes_per_s() -> f64 {
    const N: usize = 16 << 20;
    let a = vec![1.0f32; N];
    let b = vec![2.0f32; N];
    let mut c = vec![0.0f32; N];
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        for ((c, a), b) in c.iter_mut().zip(&a).zip(&b) {
            *c = a + b;
        }
        std::hint::black_box(&mut c);
        best = best.min(t.elapsed().as_secs_f64());
    }
    (3 * N * 4) as f64 / best
}
