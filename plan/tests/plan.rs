//! Planner checks against numbers known independently: GPT-2 124M's parameter count, the
//! SPEC §6.13 golden FLOPs, and how each knob must move the plan.

use megatron_plan::*;

fn gpt2_small() -> PlanInput {
    PlanInput {
        num_layers: 12,
        hidden: 768,
        heads: 12,
        query_groups: 12,
        kv_channels: 64,
        ffn: 3072,
        swiglu: false,
        padded_vocab: 50304,
        max_position_embeddings: 1024,
        learned_positions: true,
        untied: false,
        seq: 1024,
        micro_batch: 4,
        num_microbatches: 8,
        tp: 1,
        pp: 1,
        dp: 1,
        virtual_pp: 1,
        optimizer_floats: 2,
        distributed_optimizer: false,
        precision: Precision::Fp32,
        recompute: Recompute::None,
        bucket_elems: None,
    }
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
    // Full recompute keeps far fewer activations; half precision halves parameters and
    // activations but adds fp32 main parameters.
    let full = plan(&PlanInput { recompute: Recompute::Full, ..gpt2_small() });
    assert!(full.stages[0].activation_bytes * 4 < base.stages[0].activation_bytes);
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
    let text = report::render(&dp4, Some(1e10), total(&dp4) / 2);
    assert!(text.contains("DOES NOT FIT") && text.contains("--use-distributed-optimizer"), "{text}");
}

#[test]
fn data_parallel_buckets_and_shards() {
    let n: u128 = 124_475_904;
    // Plain DDP: no buckets at dp 1; at dp 2 every reduced bucket is held (all of the grads).
    assert_eq!(plan(&gpt2_small()).stages[0].grad_buffer_bytes, 0);
    let dp2 = PlanInput { dp: 2, ..gpt2_small() };
    let p = plan(&dp2);
    assert_eq!((p.stages[0].grad_buffer_bytes, p.stages[0].optimizer_bytes), (4 * n, 8 * n));
    // Distributed optimizer, one bucket: the padded bucket in flight plus this rank's share;
    // Adam's moments for the share only (the first rank's, rounded up).
    let dist = plan(&PlanInput { distributed_optimizer: true, ..dp2.clone() });
    assert_eq!(dist.stages[0].grad_buffer_bytes, 4 * (n + n / 2));
    assert_eq!(dist.stages[0].optimizer_bytes, 8 * (n / 2));
    // 40M-element buckets (overlap): only one bucket is in flight at a time.
    let b = 40_000_000u128;
    let bucketed = plan(&PlanInput { distributed_optimizer: true, bucket_elems: Some(b as usize), dp: 4, ..dp2 });
    // (The largest bucket may overshoot the size by the parameter that closed it: the
    // 50304 x 768 word embedding here.)
    assert_eq!(bucketed.stages[0].grad_buffer_bytes, 4 * (b + 50304 * 768 + n.div_ceil(4)));
    // Half precision: fp32 main parameters of every parameter, sharded or not.
    let half = plan(&PlanInput { precision: Precision::Half, distributed_optimizer: true, dp: 4, ..gpt2_small() });
    assert_eq!(half.stages[0].main_param_bytes, 4 * n);
}
