//! The communicator calls the step-time model of `megatron plan` counts
//! (plan/src/step_time.rs) against the calls a real run makes: a tiny GPT trained for 2
//! iterations with `--nproc 2` in a tp2, pp2 and dp2 layout and `--timing-log-level 1`,
//! whose per-rank breakdown lists the calls of every kind per group.

use megatron_plan::step_time::{dp_traffic, pp_traffic_per_microbatch, tp_traffic_per_microbatch};
use megatron_plan::{PlanInput, Precision, Recompute};
use std::collections::BTreeMap;
use std::process::Command;

const ITERS: f64 = 2.0;

fn tiny(tp: usize, pp: usize, dp: usize, m: usize) -> PlanInput {
    PlanInput {
        num_layers: 2,
        hidden: 64,
        heads: 4,
        query_groups: 4,
        kv_channels: 16,
        ffn: 256,
        swiglu: false,
        padded_vocab: 512,
        max_position_embeddings: 32,
        learned_positions: true,
        untied: false,
        seq: 32,
        micro_batch: 2,
        num_microbatches: m,
        tp,
        pp,
        dp,
        virtual_pp: 1,
        optimizer_floats: 2,
        distributed_optimizer: false,
        precision: Precision::Fp32,
        recompute: Recompute::None,
        bucket_elems: None,
        fp32_residual: false,
        rms_norm: false,
        sequence_parallel: false,
        cp: 1,
    }
}

/// `rank -> (call, group) -> calls` from the `--timing-log-level 1` breakdown.
fn calls(layout: &str, gbs: usize) -> BTreeMap<usize, BTreeMap<(String, String), f64>> {
    let args = format!(
        "pretrain --num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 512 --seq-length 32 \
         --max-position-embeddings 32 --micro-batch-size 2 --global-batch-size {gbs} {layout} --nproc 2 --mock-data \
         --train-iters 2 --lr 1e-4 --eval-iters 0 --eval-interval 1000 --log-interval 1 --skip-memory-check \
         --timing-log-level 1"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_megatron")).args(args.split_whitespace()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let mut by_rank = BTreeMap::new();
    let mut rank = None;
    for line in text.lines() {
        if let Some(r) = line.strip_prefix("rank ").and_then(|l| l.split(':').next()).and_then(|r| r.parse().ok()) {
            rank = Some(r);
        } else if let (Some(r), Some(n)) = (rank, line.trim_end().strip_suffix(" calls")) {
            let w: Vec<&str> = line.split_whitespace().collect();
            let n: f64 = n.rsplit(' ').next().unwrap().parse().unwrap();
            by_rank.entry(r).or_insert_with(BTreeMap::new).insert((w[0].to_string(), w[1].to_string()), n);
        }
    }
    assert_eq!(by_rank.len(), 2, "{text}");
    by_rank
}

fn get(m: &BTreeMap<(String, String), f64>, call: &str, group: &str) -> f64 {
    m.get(&(call.to_string(), group.to_string())).copied().unwrap_or(0.0) / ITERS
}

#[test]
fn step_time_counts_the_calls_a_run_makes() {
    // tp 2, M 3: per microbatch 4 per layer + embedding + output layer + 3 cross entropy.
    let x = tiny(2, 1, 1, 3);
    for ranks in calls("--tensor-model-parallel-size 2", 6).values() {
        assert_eq!(get(ranks, "all_reduce", "tp"), 3.0 * tp_traffic_per_microbatch(&x, 0).calls);
        assert_eq!(tp_traffic_per_microbatch(&x, 0).calls, 13.0);
    }
    // pp 2, M 3: one send and one recv per microbatch on each stage, the tied-embedding
    // all-reduce once; the TP calls (no-ops at tp 1, still made) split by stage.
    let x = tiny(1, 2, 1, 3);
    let tp_as_if = tiny(2, 2, 1, 3);
    for (&stage, ranks) in &calls("--pipeline-model-parallel-size 2", 6) {
        let pp = get(ranks, "send", "pp") + get(ranks, "recv", "pp");
        assert_eq!(pp, 3.0 * pp_traffic_per_microbatch(&x, stage).calls, "stage {stage}");
        assert_eq!(get(ranks, "all_reduce", "embedding"), dp_traffic(&x, stage).calls, "stage {stage}");
        assert_eq!(get(ranks, "all_reduce", "tp"), 3.0 * tp_traffic_per_microbatch(&tp_as_if, stage).calls);
    }
    // dp 2: one gradient all-reduce per iteration (one bucket).
    let x = tiny(1, 1, 2, 1);
    for ranks in calls("", 4).values() {
        assert_eq!(get(ranks, "all_reduce", "dp"), dp_traffic(&x, 0).calls);
        assert_eq!(dp_traffic(&x, 0).calls, 1.0);
    }
}
