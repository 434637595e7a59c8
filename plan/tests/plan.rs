//! Planner checks against numbers known independently: GPT-2 124M's parameter count, the
//! SPEC §6.13 golden FLOPs, and how each knob must move the plan.

use megatron_plan::step_time::Rates;
use megatron_plan::*;

mod gpt2_input;
use gpt2_input::gpt2;

fn gpt2_small() -> PlanInput {
    gpt2(1024, 4, 8)
}

#[test]
fn gpt2_124m_parameter_count() {
    // 12 (12h^2 + 13h) + 50304 h + 1024 h + 2h with h = 768 (Megatron's GPT-2 small, V padded).
    assert_eq!(gpt2_small().stage_params(0), 124_475_904);
    let p = plan(&gpt2_small());
    assert_eq!(p.stages[0].param_bytes, 4 * 124_475_904);
    assert_eq!(p.stages[0].optimizer_bytes, 8 * 124_475_904);
}

#[test]
fn spec_golden_flops() {
    let x = PlanInput {
        num_layers: 24,
        hidden: 1024,
        heads: 16,
        query_groups: 16,
        kv_channels: 64,
        ffn: 4096,
        padded_vocab: 50304,
        seq: 1024,
        ..gpt2_small()
    };
    let f = flops_per_iteration(&x, 8);
    assert!((f - 1.8612240777216e13).abs() < 1.0, "{f}");
}

#[test]
fn knobs_move_the_plan_the_right_way() {
    let base = plan(&gpt2_small());
    let total = |x: &PlanInput| plan(x).process_bytes();
    // tp 2 halves the layer and vocab parameters per rank (position embeddings and norms stay).
    let tp2 = plan(&PlanInput { tp: 2, ..gpt2_small() });
    assert!(tp2.stages[0].params < base.stages[0].params / 2 + 1024 * 768 + 10_000);
    // pp 2: stage 0 holds 2 microbatches in flight, stage 1 one; the last stage has the tied copy.
    let pp2 = plan(&PlanInput { pp: 2, ..gpt2_small() });
    assert_eq!((pp2.stages[0].in_flight, pp2.stages[1].in_flight), (2, 1));
    assert!(pp2.stages[1].params > 6 * 7_087_872 + 50304 * 768);
    // Full recompute (not in `pretrain` yet) keeps far fewer activations (the logits stay);
    // half precision halves parameters and activations but adds fp32 main parameters.
    let full = plan(&PlanInput { recompute: Recompute::Full, ..gpt2_small() });
    assert!(full.stages[0].activation_bytes * 2 < base.stages[0].activation_bytes);
    let half = plan(&PlanInput { precision: Precision::Half, ..gpt2_small() });
    assert_eq!(half.stages[0].param_bytes * 2, base.stages[0].param_bytes);
    assert_eq!(half.stages[0].main_param_bytes, base.stages[0].param_bytes);
    // The distributed optimizer shards optimizer state over dp.
    let dp4 = PlanInput { dp: 4, ..gpt2_small() };
    let dist = plan(&PlanInput { distributed_optimizer: true, ..dp4.clone() });
    assert_eq!(dist.stages[0].optimizer_bytes * 4, plan(&dp4).stages[0].optimizer_bytes);
    // Over budget: every suggestion is smaller than the plan, and they are only made then.
    let need = total(&gpt2_small());
    assert!(suggestions(&gpt2_small(), need).is_empty());
    let sug = suggestions(&dp4, total(&dp4) / 2);
    assert!(sug.len() >= 4, "{sug:?}");
    assert!(sug.iter().all(|s| s.process_bytes < total(&dp4)), "{sug:?}");
    // Interleaving holds more chunks in flight, each a fraction of the stage.
    let inter = PlanInput { pp: 2, virtual_pp: 2, ..gpt2_small() };
    assert_eq!(in_flight(&inter, 0), (5, 0.5));
    let rates = Rates { gemm_flops_per_s: 1e10, comm_bytes_per_s: 1e9, comm_latency_s: 1e-5, mem_bytes_per_s: 4e9 };
    let text = report::render(&dp4, Some(rates), total(&dp4) / 2);
    assert!(text.contains("DOES NOT FIT") && text.contains("--use-distributed-optimizer"), "{text}");
}

#[test]
fn data_parallel_buckets_and_shards() {
    let n: u128 = 124_475_904;
    let wte: u128 = 50304 * 768;
    let stage0 = |x: &PlanInput| grad_buffer_elems(x, 0, x.stage_params(0));
    // Plain DDP: no buckets at dp 1; at dp 2 every reduced bucket is held (all of the grads).
    assert_eq!(stage0(&gpt2_small()), 0);
    let dp2 = PlanInput { dp: 2, ..gpt2_small() };
    assert_eq!(stage0(&dp2), n);
    assert_eq!(plan(&dp2).stages[0].optimizer_bytes, 8 * n);
    // Its largest phase: the write-back holds the reduced bucket, its host copy and two
    // copies of the word embedding (2N + 2·wte > the all-reduce's 2N + N/2).
    let t = plan(&dp2).stages[0].clone();
    assert_eq!((t.transient_phase, t.transient_bytes), ("DDP grad write-back", 4 * (2 * n + 2 * wte)));
    // Distributed optimizer, one bucket: the padded bucket in flight plus this rank's share;
    // Adam's moments for the share only (the first rank's, rounded up).
    let dist = PlanInput { distributed_optimizer: true, ..dp2.clone() };
    assert_eq!(stage0(&dist), n + n / 2);
    assert_eq!(plan(&dist).stages[0].optimizer_bytes, 8 * (n / 2));
    // ... and its largest phase the all-gather of the updated bucket: `out`, its host copy and
    // that copy's Vec (3N) besides the local share.
    let t = plan(&dist).stages[0].clone();
    assert_eq!((t.transient_phase, t.transient_bytes), ("param all-gather", 4 * (3 * n + n / 2)));
    // 40M-element buckets (overlap): only one bucket is in flight at a time.
    let b = 40_000_000u128;
    let bucketed = PlanInput { distributed_optimizer: true, bucket_elems: Some(b as usize), dp: 4, ..dp2 };
    // (The largest bucket may overshoot the size by the parameter that closed it: the
    // 50304 x 768 word embedding here.)
    assert_eq!(stage0(&bucketed), b + wte + n.div_ceil(4));
    assert_eq!(plan(&bucketed).stages[0].transient_bytes, 4 * ((b + wte) / 4 + 3 * (b + wte)));
    // Half precision: fp32 main parameters of the shard with the distributed optimizer; the
    // embedding lookup widens the bf16 table to fp32 (the largest phase without data parallelism).
    let half = plan(&PlanInput { precision: Precision::Half, distributed_optimizer: true, dp: 4, ..gpt2_small() });
    assert_eq!(half.stages[0].main_param_bytes, 4 * n.div_ceil(4));
    let t = plan(&PlanInput { precision: Precision::Half, ..gpt2_small() }).stages[0].clone();
    assert_eq!((t.transient_phase, t.transient_bytes), ("half inputs widened to fp32", 4 * wte));
    // No data parallelism, fp32: only the (B, T, C) copies of backward.
    let t = plan(&gpt2_small()).stages[0].clone();
    assert_eq!((t.transient_phase, t.transient_bytes), ("forward/backward copies", 4 * 4 * 1024 * 768));
}

/// The activation and workspace terms buffer by buffer for GPT-2 124M at B = 2, T = 256 (the
/// sizes heaptrack shows at the peak of `megatron pretrain`, see docs/plan.md).
#[test]
fn activation_buffers_of_gpt2_small() {
    let x = PlanInput { micro_batch: 2, seq: 256, num_microbatches: 1, ..gpt2_small() };
    let (n, c, f, v) = (512u128, 768u128, 3072u128, 50304u128);
    // Per layer: ln1_out, ln2_out, h1, output (4C), qkv (3C), context (C), fc1_out, act_out
    // (2F), in fp32; lse (12 heads) and LayerNorm mean + rstd twice (4) in fp32.
    assert_eq!(activation_bytes_per_microbatch_layer(&x), n * 4 * (8 * c + 2 * f + 12 + 4));
    // The stage adds residuals[0], the block output, the final norm's mean + rstd, the logits
    // and the 3 CE statistics.
    let st = plan(&x).stages[0].clone();
    assert_eq!(st.activation_bytes, 12 * n * 4 * (8 * c + 2 * f + 16) + n * 4 * (2 * c + 2 + v + 3));
    // Workspace: d_residual, d_branch, d_norm, d_context, d_qkv (3C), d_act, d_fc1, d_hidden
    // and d_embedding.
    assert_eq!(st.workspace_bytes, n * 4 * (9 * c + 2 * f));
}
