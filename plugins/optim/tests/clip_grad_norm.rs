//! Global gradient norm and clipping (SPEC §6.6) on the CPU backend, including the TP rule
//! that replicated params count on TP rank 0 only.

use megatron_comm_local::LocalCommunicator;
use megatron_core::{Backend, HostBuffer, ParallelContext, Param, ParamLayout, RankGrid};
use megatron_cpu::CpuBackend;
use megatron_optim::{clip_grad_norm, grad_norm, grads_have_inf_or_nan, is_finite_norm};
use std::time::Duration;

/// Runs `f(rank, ctx)` on every rank of a tp = `n` world, ranks as threads over the real
/// `local` communicator; returns the results in rank order.
fn on_tp_ranks<T: Send>(n: usize, f: impl Fn(usize, ParallelContext) -> T + Sync) -> Vec<T> {
    let grid = RankGrid::new(n, n, 1, 1).unwrap();
    let comms = LocalCommunicator::world(n, Duration::from_secs(60));
    std::thread::scope(|s| {
        let (f, grid) = (&f, &grid);
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| s.spawn(move || f(rank, grid.context(rank, comm))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn param(b: &dyn Backend, name: &str, grad: &[f32], tp_axis: Option<usize>) -> Param {
    let shape = [grad.len()];
    let mut layout = ParamLayout::replicated(&shape, false);
    layout.tp_axis = tp_axis;
    Param {
        name: name.into(),
        value: b.zeros(&shape, megatron_core::DType::F32).unwrap(),
        grad: b.from_host(HostBuffer::F32(grad.to_vec()), &shape).unwrap(),
        layout,
    }
}

fn grads(b: &dyn Backend, p: &Param) -> Vec<f32> {
    b.to_host(&p.grad).unwrap().to_f32_vec()
}

#[test]
fn norm_and_clipping_on_one_rank() {
    let b = CpuBackend::new();
    let ctx = ParallelContext::single();
    let mut w = param(&b, "w", &[3.0, 0.0], None);
    let mut v = param(&b, "v", &[4.0], Some(0));

    // Under the limit: norm reported, grads untouched.
    let norm = clip_grad_norm(&mut [&mut w, &mut v], 10.0, &b, &ctx).unwrap();
    assert!((norm - 5.0).abs() < 1e-12);
    assert_eq!(grads(&b, &w), [3.0, 0.0]);

    // Over the limit: every grad scaled by max_norm / (norm + 1e-6).
    let norm = clip_grad_norm(&mut [&mut w, &mut v], 1.0, &b, &ctx).unwrap();
    assert!((norm - 5.0).abs() < 1e-12);
    let coef = 1.0 / (5.0 + 1e-6);
    assert!((grads(&b, &w)[0] as f64 - 3.0 * coef).abs() < 1e-6);
    assert!((grads(&b, &v)[0] as f64 - 4.0 * coef).abs() < 1e-6);
    let after = grad_norm(&[&w, &v], &b, &ctx).unwrap();
    assert!((after - 1.0).abs() < 1e-5, "clipped norm {after}");

    // --clip-grad 0: no clipping and a reported norm of 0.0.
    let before = grads(&b, &w);
    assert_eq!(clip_grad_norm(&mut [&mut w, &mut v], 0.0, &b, &ctx).unwrap(), 0.0);
    assert_eq!(grads(&b, &w), before);
}

#[test]
fn replicated_params_count_on_tp_rank_zero_only() {
    // Both ranks hold the replicated [3, 4] (25, counted once) and their shard of fc1:
    // [1, 2] (5) on rank 0, [2, 4] (20) on rank 1. Every rank gets sqrt(50).
    let norms = on_tp_ranks(2, |rank, ctx| {
        let b = CpuBackend::new();
        let rep = param(&b, "norm.weight", &[3.0, 4.0], None);
        let shard = param(&b, "fc1.weight", if rank == 0 { &[1.0, 2.0] } else { &[2.0, 4.0] }, Some(0));
        grad_norm(&[&rep, &shard], &b, &ctx).unwrap()
    });
    for (rank, norm) in norms.into_iter().enumerate() {
        assert!((norm - 50f64.sqrt()).abs() < 1e-12, "rank {rank}: {norm}");
    }
}

#[test]
fn inf_and_nan_are_detected() {
    let b = CpuBackend::new();
    let ctx = ParallelContext::single();
    let mut w = param(&b, "w", &[1.0, f32::NAN], None);
    let norm = clip_grad_norm(&mut [&mut w], 1.0, &b, &ctx).unwrap();
    assert!(!is_finite_norm(norm));
    assert!(grads_have_inf_or_nan(&[&w], &b, &ctx).unwrap());
    let inf = param(&b, "i", &[f32::INFINITY], None);
    assert!(grads_have_inf_or_nan(&[&inf], &b, &ctx).unwrap());
    let fine = param(&b, "f", &[1.0, -2.0], None);
    assert!(!grads_have_inf_or_nan(&[&fine], &b, &ctx).unwrap());
    assert!(is_finite_norm(grad_norm(&[&fine], &b, &ctx).unwrap()));

    // Another rank of the model-parallel group found an inf: every rank must skip.
    let found = on_tp_ranks(2, |rank, ctx| {
        let b = CpuBackend::new();
        let g = param(&b, "g", if rank == 1 { &[f32::INFINITY] } else { &[1.0] }, Some(0));
        grads_have_inf_or_nan(&[&g], &b, &ctx).unwrap()
    });
    assert_eq!(found, [true, true]);
}
