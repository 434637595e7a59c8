//! The multi-rank step-time model (plan/src/step_time.rs) against volumes worked out by hand
//! for GPT-2 124M and against the properties the schedule must have. Its calls per iteration
//! are checked against a real run's communicator in tests/plan_step_calls.rs.

use megatron_plan::step_time::{dp_traffic, pp_traffic_per_microbatch, predict, tp_traffic_per_microbatch, Rates};
use megatron_plan::*;

mod gpt2_input;
use gpt2_input::gpt2;

const RATES: Rates =
    Rates { gemm_flops_per_s: 20e9, comm_bytes_per_s: 2e9, comm_latency_s: 20e-6, mem_bytes_per_s: 4e9 };

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-300)
}

#[test]
fn one_rank_is_the_gemm_bound_time_plus_the_optimizer() {
    let x = gpt2(256, 2, 1);
    let t = predict(&x, &RATES);
    assert!(rel(t.compute_s, predicted_step_seconds(&x, RATES.gemm_flops_per_s)) < 1e-12, "{t:?}");
    assert_eq!((t.bubble_s, t.tp_comm_s, t.pp_comm_s, t.dp_comm_s), (0.0, 0.0, 0.0, 0.0));
    // Adam touches 7 fp32 arrays of N = 124,475,904 elements (V padded to 50304).
    assert!(rel(t.optimizer_s, 124_475_904.0 * 28.0 / 4e9) < 1e-12, "{t:?}");
}

#[test]
fn tensor_parallel_volume_by_hand() {
    // tp 2, B 2, T 256: (B, T, C) fp32 = 2 * 256 * 768 * 4 bytes; per layer 4 all-reduces,
    // plus the embedding, the output layer's input gradient and 3 cross-entropy (B, T) fp32.
    let x = PlanInput { tp: 2, ..gpt2(256, 2, 3) };
    let btc = (2 * 256 * 768 * 4) as f64;
    let t = tp_traffic_per_microbatch(&x, 0);
    assert_eq!(t.calls, 48.0 + 1.0 + 4.0);
    assert_eq!(t.bytes, 48.0 * btc + 2.0 * btc + 3.0 * 512.0 * 4.0);
    let p = predict(&x, &RATES);
    assert!(
        rel(p.tp.bytes, 3.0 * t.bytes) < 1e-12 && rel(p.tp_comm_s, 3.0 * (t.calls * 20e-6 + t.bytes / 2e9)) < 1e-12
    );
    // Half the GEMM work per rank.
    let one = predict(&gpt2(256, 2, 3), &RATES);
    assert!(rel(p.compute_s * 2.0, one.compute_s) < 1e-9, "{p:?} {one:?}");
    // Half precision halves the activation volume.
    let half = PlanInput { precision: Precision::Half, ..x.clone() };
    assert!(tp_traffic_per_microbatch(&half, 0).bytes < 0.51 * t.bytes);
}

#[test]
fn pipeline_bubble_and_transfers() {
    // pp 2, M 4: 1F1B runs M + pp - 1 = 5 slots of one stage's microbatch.
    let x = PlanInput { pp: 2, ..gpt2(256, 2, 4) };
    let p = predict(&x, &RATES);
    let slot = (p.compute_s + p.pp_comm_s) / 4.0;
    assert!(rel(p.bubble_s, slot) < 1e-12, "{p:?}");
    // Each stage has one neighbour: activation out/in and its gradient, (B, T, C) fp32 each.
    let btc = (2 * 256 * 768 * 4) as f64;
    assert_eq!(pp_traffic_per_microbatch(&x, 0).bytes, 2.0 * btc);
    assert_eq!(pp_traffic_per_microbatch(&PlanInput { pp: 4, ..x.clone() }, 1).bytes, 4.0 * btc);
    // More microbatches: a smaller bubble fraction; interleaving (v = 2) halves the bubble.
    let more = predict(&PlanInput { num_microbatches: 16, ..x.clone() }, &RATES);
    assert!(more.bubble_s / more.compute_s < p.bubble_s / p.compute_s);
    let inter = predict(&PlanInput { virtual_pp: 2, ..x.clone() }, &RATES);
    assert!(rel(inter.bubble_s * 2.0, p.bubble_s) < 1e-12);
    // Tied embeddings: the first and last stage all-reduce the V x C fp32 gradient.
    assert_eq!(dp_traffic(&x, 0).bytes, (50304 * 768 * 4) as f64);
    assert_eq!(dp_traffic(&PlanInput { untied: true, ..x }, 0).bytes, 0.0);
}

#[test]
fn data_parallel_volume_by_hand() {
    let n = 124_475_904.0;
    let dp2 = PlanInput { dp: 2, ..gpt2(256, 2, 1) };
    assert_eq!(dp_traffic(&dp2, 0).bytes, n * 4.0);
    assert_eq!(dp_traffic(&dp2, 0).calls, 1.0);
    // Distributed optimizer: reduce-scatter of fp32 grads + all-gather of the parameters;
    // the optimizer step updates half the elements.
    let dist = PlanInput { distributed_optimizer: true, ..dp2.clone() };
    assert_eq!(dp_traffic(&dist, 0).bytes, n * 8.0);
    let (a, b) = (predict(&dp2, &RATES), predict(&dist, &RATES));
    assert!(rel(b.optimizer_s * 2.0, a.optimizer_s) < 1e-12);
    // Each rank runs its own microbatch: the compute of the one-rank run of one microbatch.
    assert!(rel(a.compute_s, predict(&gpt2(256, 2, 1), &RATES).compute_s) < 1e-12);
    // Buckets: one call each.
    let b4 = PlanInput { bucket_elems: Some(40_000_000), ..dp2 };
    assert_eq!(dp_traffic(&b4, 0).calls, 4.0);
}

#[test]
fn ranks_sharing_cores_stretch_compute_only() {
    use megatron_plan::step_time::{predict_shared, Contention};
    let x = PlanInput { tp: 2, pp: 2, ..gpt2(256, 2, 4) };
    let base = predict(&x, &RATES);
    // No sharing: the plain prediction, nothing added.
    assert_eq!(predict_shared(&x, &RATES, &Contention::NONE), base);
    let fits = Contention { cores: 4, threads_per_rank: 1, concurrent_ratio: 1.0 };
    assert_eq!(predict_shared(&x, &RATES, &fits).contention_s, 0.0);
    // 4 ranks x 1 thread on 2 cores: time-sliced x2, so every compute slot (bubble included)
    // takes twice as long; communication and the optimizer are unchanged.
    let two = Contention { cores: 2, threads_per_rank: 1, concurrent_ratio: 1.0 };
    let t = predict_shared(&x, &RATES, &two);
    let slot_compute = base.compute_s / 4.0;
    assert!(rel(t.contention_s, (4.0 + 1.0) * slot_compute) < 1e-12, "{t:?}");
    assert_eq!(
        (t.tp_comm_s, t.pp_comm_s, t.dp_comm_s, t.optimizer_s),
        (base.tp_comm_s, base.pp_comm_s, base.dp_comm_s, base.optimizer_s)
    );
    assert!(rel(t.total_s(), base.total_s() + t.contention_s) < 1e-12);
    // Ranks that fit on the cores but run at 0.5 of their rate alone: compute doubles too;
    // both effects multiply.
    let half = Contention { cores: 4, threads_per_rank: 1, concurrent_ratio: 0.5 };
    assert!(rel(predict_shared(&x, &RATES, &half).contention_s, t.contention_s) < 1e-12);
    let both = Contention { cores: 2, threads_per_rank: 1, concurrent_ratio: 0.5 };
    assert!(rel(both.compute_slowdown(4), 4.0) < 1e-12);
    assert!(rel(predict_shared(&x, &RATES, &both).contention_s, 3.0 * (4.0 + 1.0) * slot_compute) < 1e-12);
    // One rank never contends with itself.
    let one = gpt2(256, 2, 1);
    assert_eq!(predict_shared(&one, &RATES, &both), predict(&one, &RATES));
}
