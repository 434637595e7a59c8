//! The memory check of `megatron pretrain`: before anything big is allocated, estimate what
//! the run needs (parameters, gradients, optimizer state, activations, for every rank of
//! this process) and refuse, with the estimate and the machine's memory, when it cannot fit.
//! `--skip-memory-check` overrides. The estimate is the planner's (`megatron plan`, the
//! `megatron-plan` crate: the same numbers, docs/plan.md compares them with measured peak
//! RSS) wherever the planner models the layout; for what it does not model (context or
//! sequence parallelism, mixture-of-experts layers, partial full recomputation) a simpler
//! count of parameters, gradients, optimizer state and activations is used instead.

use crate::config::TrainConfig;
use anyhow::{bail, Result};

/// Bytes a run needs, by category (whole process: all ranks are threads of it).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MemoryEstimate {
    /// Parameter elements of the whole model (one replica).
    pub params: u128,
    pub param_bytes: u128,
    pub grad_bytes: u128,
    /// Optimizer state, and the fp32 main parameters of half-precision runs.
    pub optimizer_bytes: u128,
    /// Activations, with the planner: also the backward workspace and the largest
    /// short-lived buffers of a step.
    pub activation_bytes: u128,
    /// The process without a model (runtime, rank threads).
    pub overhead_bytes: u128,
    /// Whether this came from the planner (else the simple count).
    pub from_planner: bool,
}

impl MemoryEstimate {
    pub fn total(&self) -> u128 {
        self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.activation_bytes + self.overhead_bytes
    }
}

/// The memory the process may use: the smallest of physical memory (`MemTotal`), the cgroup
/// limit (v2 `memory.max`, v1 `memory.limit_in_bytes`) and the address-space rlimit, with
/// where it came from; plus `MemAvailable` for the message.
#[derive(Clone, Debug)]
pub struct MachineMemory {
    pub limit: u128,
    pub source: String,
    pub available: Option<u128>,
}

fn meminfo_kib(text: &str, key: &str) -> Option<u128> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].trim().trim_end_matches("kB").trim().parse::<u128>().ok().map(|k| k * 1024)
}

/// Reads the limits of this machine and process (Linux; `None` elsewhere).
pub fn machine_memory() -> Option<MachineMemory> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let mut best = (meminfo_kib(&meminfo, "MemTotal:")?, "physical memory (/proc/meminfo MemTotal)".to_string());
    let read_num = |p: &str| std::fs::read_to_string(p).ok().and_then(|s| s.trim().parse::<u128>().ok());
    let cgroups = [
        ("/sys/fs/cgroup/memory.max", "cgroup v2 memory.max"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "cgroup v1 memory.limit_in_bytes"),
    ];
    for (path, what) in cgroups {
        if let Some(v) = read_num(path).filter(|&v| v < best.0) {
            best = (v, format!("{what} ({path})"));
        }
    }
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    if let Some(line) = limits.lines().find(|l| l.starts_with("Max address space")) {
        let soft = line.split_whitespace().nth(3).and_then(|v| v.parse::<u128>().ok());
        if let Some(v) = soft.filter(|&v| v < best.0) {
            best = (v, "address-space limit (ulimit -v)".to_string());
        }
    }
    Some(MachineMemory { limit: best.0, source: best.1, available: meminfo_kib(&meminfo, "MemAvailable:") })
}

/// The estimate for the `gpt` model of `cfg` with `padded` vocabulary rows: the planner's
/// where it models the layout, else [`simple_estimate`]; `None` for other models (their
/// shapes are unknown here).
pub fn estimate(cfg: &TrainConfig, vocab_size: usize, padded: usize) -> Option<MemoryEstimate> {
    planner_estimate(cfg, vocab_size).or_else(|| simple_estimate(cfg, vocab_size, padded))
}

/// The process total of `megatron plan` by category (every rank is a thread of this process).
#[cfg(all(feature = "gpt", feature = "optim", feature = "checkpoint"))]
pub fn planner_estimate(cfg: &TrainConfig, vocab_size: usize) -> Option<MemoryEstimate> {
    let a = &cfg.args;
    // Layouts the planner does not model (it would under-count them).
    if a.context_parallel_size > 1 || a.sequence_parallel {
        return None;
    }
    let input = crate::plan_cli::plan_input(cfg, vocab_size).ok()?;
    let p = megatron_plan::plan(&input);
    let ranks = p.ranks_per_stage as u128;
    let sum = |f: fn(&megatron_plan::StagePlan) -> u128| p.stages.iter().map(f).sum::<u128>() * ranks;
    let whole = megatron_plan::PlanInput { tp: 1, pp: 1, ..input.clone() };
    Some(MemoryEstimate {
        params: whole.stage_params(0),
        param_bytes: sum(|s| s.param_bytes),
        grad_bytes: sum(|s| s.grad_bytes),
        optimizer_bytes: sum(|s| s.main_param_bytes + s.optimizer_bytes),
        activation_bytes: sum(|s| s.activation_bytes + s.workspace_bytes + s.transient_bytes),
        overhead_bytes: p.overhead_bytes,
        from_planner: true,
    })
}

#[cfg(not(all(feature = "gpt", feature = "optim", feature = "checkpoint")))]
pub fn planner_estimate(_cfg: &TrainConfig, _vocab_size: usize) -> Option<MemoryEstimate> {
    None
}

/// The simple count for layouts the planner does not model: parameters, gradients and
/// optimizer state of every replica, one microbatch of activations per rank (pp in flight on
/// the first stage), a fixed runtime allowance.
#[cfg(feature = "gpt")]
pub fn simple_estimate(cfg: &TrainConfig, vocab_size: usize, padded: usize) -> Option<MemoryEstimate> {
    let a = &cfg.args;
    if a.model != "gpt" {
        return None;
    }
    let mut gpt: megatron_gpt::GptConfig = serde_json::from_value(cfg.model_config(vocab_size)).ok()?;
    gpt.padded_vocab_size = Some(padded);
    let params = megatron_gpt::gpt_param_count(&gpt, padded) as u128;
    let (tp, pp, dp) = (
        a.tensor_model_parallel_size.max(1) as u128,
        a.pipeline_model_parallel_size.max(1) as u128,
        cfg.data_parallel_size.max(1) as u128,
    );
    // Context parallelism: cp more ranks, each a replica of its tp x pp shard on T/cp tokens.
    let cp = a.context_parallel_size.max(1) as u128;
    let world = tp * pp * dp * cp;
    // Every data-parallel (and context-parallel) replica holds the whole model, sharded over tp x pp ranks.
    let replicas = params * dp * cp;
    let optimizer_floats: u128 = if a.optimizer == "sgd" { 1 } else { 2 };
    // Per rank: activations of one microbatch through its layers, in f32 (src: the modules'
    // cached tensors; dropout masks are regenerated, attention never stores T x T scores).
    let (b, t, c) = (a.micro_batch_size as u128, a.seq_length as u128 / cp, a.hidden_size as u128);
    let f = a.ffn_hidden_size.map_or(4 * c, |f| f as u128);
    let gates: u128 = if a.swiglu { 2 } else { 1 };
    let heads = a.num_attention_heads as u128;
    let layers = (a.num_layers as u128).div_ceil(pp);
    // residual, ln1_out, h1, ln2_out (C each); qkv 3C/tp, context C/tp; fc1 gates*F/tp and
    // act F/tp; lse heads/tp; norm statistics 4.
    // With --sequence-parallel the four C-wide tensors and the norm statistics are token shards.
    let sp = if a.sequence_parallel { tp } else { 1 };
    let per_token_layer = 4 * c / sp + 4 * c / tp + (gates + 1) * f / tp + heads / tp + 4 / sp;
    // Logits (B, T, V/tp) and the backward scratch: a few (B, T, C) and (B, T, F/tp).
    let per_token_fixed = padded as u128 / tp + 6 * c + 2 * gates * f / tp;
    // 1F1B keeps up to pp microbatches in flight on the first stage.
    let in_flight = if pp > 1 { pp.min(cfg.num_microbatches as u128) } else { 1 };
    let per_rank_act = 4 * b * t * (per_token_layer * layers * in_flight + per_token_fixed);
    Some(MemoryEstimate {
        params,
        param_bytes: 4 * replicas,
        grad_bytes: 4 * replicas,
        optimizer_bytes: 4 * optimizer_floats * replicas,
        activation_bytes: per_rank_act * world,
        overhead_bytes: (96 << 20) + world * (16 << 20),
        from_planner: false,
    })
}

#[cfg(not(feature = "gpt"))]
pub fn simple_estimate(_cfg: &TrainConfig, _vocab_size: usize, _padded: usize) -> Option<MemoryEstimate> {
    None
}

fn gib(bytes: u128) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// The refusal of a run whose estimate exceeds the machine's memory (`Ok` when it fits, when
/// the model is not one the estimate knows, or with `--skip-memory-check`).
pub fn check(cfg: &TrainConfig, vocab_size: usize, padded: usize) -> Result<Option<MemoryEstimate>> {
    let Some(e) = estimate(cfg, vocab_size, padded) else { return Ok(None) };
    if cfg.args.skip_memory_check {
        return Ok(Some(e));
    }
    let Some(machine) = machine_memory() else { return Ok(Some(e)) };
    if e.total() > machine.limit {
        bail!(
            "this run needs about {} of memory, more than the {} this process may use ({}{}):\n    \
             parameters {} ({} elements x data-parallel replicas), gradients {}, optimizer state {}, \
             activations {} (--micro-batch-size {} x --seq-length {} through {} layers), runtime {}{}.\n  \
             Reduce --num-layers/--hidden-size/--seq-length/--micro-batch-size, or pass --skip-memory-check \
             to try anyway",
            gib(e.total()),
            gib(machine.limit),
            machine.source,
            machine.available.map_or(String::new(), |a| format!("; {} available now", gib(a))),
            gib(e.param_bytes),
            e.params,
            gib(e.grad_bytes),
            gib(e.optimizer_bytes),
            gib(e.activation_bytes),
            cfg.args.micro_batch_size,
            cfg.args.seq_length,
            cfg.args.num_layers,
            gib(e.overhead_bytes),
            if e.from_planner {
                "; `megatron plan` with the same flags shows it per stage and suggests changes"
            } else {
                ""
            },
        );
    }
    Ok(Some(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_lines_parse() {
        let text = "MemTotal:       24684092 kB\nMemFree:  1 kB\nMemAvailable:   23274080 kB\n";
        assert_eq!(meminfo_kib(text, "MemTotal:"), Some(24684092 * 1024));
        assert_eq!(meminfo_kib(text, "MemAvailable:"), Some(23274080 * 1024));
        assert_eq!(meminfo_kib(text, "Swap:"), None);
    }

    #[cfg(all(feature = "gpt", feature = "optim", feature = "checkpoint"))]
    fn config(flags: &str) -> TrainConfig {
        use clap::Parser;
        let argv = format!(
            "megatron pretrain --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 \
             --max-position-embeddings 32 --vocab-size 1000 --mock-data --train-iters 1 --lr 1e-4 {flags}"
        );
        let cli = crate::cli::Cli::try_parse_from(argv.split_whitespace()).unwrap();
        let crate::cli::Command::Pretrain(a) = cli.command else { panic!("not pretrain") };
        TrainConfig::from_args(&a, a.nproc).unwrap()
    }

    /// The check and `megatron plan` give the same total (one source of truth), by category;
    /// layouts the planner does not model fall back to the simple count.
    #[test]
    #[cfg(all(feature = "gpt", feature = "optim", feature = "checkpoint"))]
    fn the_check_uses_the_planner() {
        for flags in [
            "--micro-batch-size 2 --global-batch-size 4 --nproc 2",
            "--micro-batch-size 2 --global-batch-size 4 --tensor-model-parallel-size 2 --nproc 2 --bf16",
            "--micro-batch-size 1 --global-batch-size 4 --pipeline-model-parallel-size 2 --nproc 2",
        ] {
            let cfg = config(flags);
            let padded = cfg.padded_vocab(1000);
            let e = estimate(&cfg, 1000, padded).unwrap();
            let plan = megatron_plan::plan(&crate::plan_cli::plan_input(&cfg, 1000).unwrap());
            assert!(e.from_planner, "{flags}");
            assert_eq!(e.total(), plan.process_bytes(), "{flags}");
            // Parameters per replica: the whole model whatever the layout.
            assert_eq!(e.params, estimate(&config("--micro-batch-size 1"), 1000, padded).unwrap().params, "{flags}");
        }
        let sp = config("--micro-batch-size 2 --tensor-model-parallel-size 2 --nproc 2 --sequence-parallel");
        let e = estimate(&sp, 1000, sp.padded_vocab(1000)).unwrap();
        assert!(!e.from_planner);
        assert_eq!(e, simple_estimate(&sp, 1000, sp.padded_vocab(1000)).unwrap());
    }

    #[test]
    fn machine_memory_is_positive_on_linux() {
        if let Some(m) = machine_memory() {
            assert!(m.limit > 0, "{m:?}");
        }
    }
}
