//! Bucketed DDP gradient reduction (SPEC §5.6) with real thread ranks (`local` communicator):
//! the bucketed reduction, with and without `--overlap-grad-reduce`, gives bitwise the
//! gradients of the plain per-parameter all-reduce, which match the f64 mean of the replicas.
//! The overlapped buckets run on a helper thread while the main thread issues
//! tensor-parallel collectives, as during backward.

use megatron_comm_local::LocalCommunicator;
use megatron_core::{
    Backend, DeviceTensor, GradSync, HostBuffer, ParallelContext, ParallelStrategy, Param, ParamLayout, ReduceOp,
};
use megatron_cpu::CpuBackend;
use megatron_parallel::{DdpOptions, DdpReducer, MegatronStrategy, StrategyConfig};
use std::sync::Arc;
use std::time::Duration;

const SHAPES: [&[usize]; 6] = [&[3, 4], &[7], &[2, 5], &[6], &[4, 4], &[1]];

/// Rank-dependent gradients whose f32 sums round (so summation order would show).
fn grad_value(rank: usize, param: usize, i: usize) -> f32 {
    ((rank * 97 + param * 31 + i * 7) as f32 * 0.618_034).sin() * (1.0 + rank as f32 * 1e3)
}

fn params(rank: usize) -> Vec<Param> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(p, shape)| {
            let n: usize = shape.iter().product();
            let t = |v: Vec<f32>| DeviceTensor::from_host_buffer(HostBuffer::F32(v), shape).unwrap();
            Param {
                name: format!("p{p}"),
                value: t(vec![0.0; n]),
                grad: t((0..n).map(|i| grad_value(rank, p, i)).collect()),
                layout: ParamLayout::replicated(shape, false),
            }
        })
        .collect()
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    PerParam,
    Buckets,
    Overlap { report_all: bool },
}

/// Reduces the gradients of every rank of a tp=2 x dp=2 world in `mode`; returns them by rank.
fn reduce(mode: Mode) -> Vec<Vec<Vec<f32>>> {
    let comms = LocalCommunicator::world(4, Duration::from_secs(30));
    let config = StrategyConfig { tensor_model_parallel_size: 2, ..StrategyConfig::default() };
    let strategy = MegatronStrategy::new(config).unwrap();
    let strategy = &strategy;
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|comm| {
                let ctx = strategy.build_context(comm.clone()).unwrap();
                s.spawn(move || run_rank(mode, strategy, ctx))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn run_rank(mode: Mode, strategy: &MegatronStrategy, ctx: ParallelContext) -> Vec<Vec<f32>> {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut ps = params(ctx.rank);
    // Two steps, so the reducer's reset between steps is exercised too.
    for _step in 0..2 {
        ps = params(ctx.rank);
        let mut refs: Vec<&mut Param> = ps.iter_mut().collect();
        match mode {
            Mode::PerParam => strategy.reduce_gradients(&mut refs, backend.as_ref(), &ctx).unwrap(),
            Mode::Buckets | Mode::Overlap { .. } => {
                let overlap = matches!(mode, Mode::Overlap { .. });
                let view: Vec<&Param> = refs.iter().map(|p| &**p).collect();
                let options = DdpOptions { bucket_size: Some(10), overlap_grad_reduce: overlap, ..Default::default() };
                let mut ddp = DdpReducer::new(&view, options, backend.clone(), &ctx).unwrap();
                if overlap {
                    assert_eq!(ddp.buckets().len(), 3, "buckets of >= 10 elements, reversed: {:?}", ddp.buckets());
                }
                let report_all = matches!(mode, Mode::Overlap { report_all: true } | Mode::Buckets);
                // Backward order: last parameter first; a TP collective between reports, as
                // the layers' backward would issue while buckets reduce in the background.
                for (k, p) in view.iter().enumerate().rev() {
                    if report_all || k % 2 == 0 {
                        ddp.grads_ready(&[p]).unwrap();
                    }
                    let mut x = DeviceTensor::from_host_buffer(HostBuffer::F32(vec![k as f32]), &[1]).unwrap();
                    ctx.comm.all_reduce(&ctx.tp_group, &mut x, ReduceOp::Sum).unwrap();
                    assert_eq!(x.host_f32().unwrap(), [2.0 * k as f32]);
                }
                ddp.finish(&mut refs, backend.as_ref()).unwrap();
            }
        }
    }
    ps.iter().map(|p| p.grad.host_f32().unwrap().to_vec()).collect()
}

#[test]
fn bucketed_and_overlapped_reduction_equal_the_per_parameter_all_reduce() {
    let plain = reduce(Mode::PerParam);
    // Reference in f64: the mean over each rank's DP replicas (ranks r and r^2 share a TP rank).
    for (rank, grads) in plain.iter().enumerate() {
        let peer = rank ^ 2;
        for (p, g) in grads.iter().enumerate() {
            for (i, &x) in g.iter().enumerate() {
                let want = (grad_value(rank, p, i) as f64 + grad_value(peer, p, i) as f64) / 2.0;
                assert!((x as f64 - want).abs() <= 1e-6 * want.abs().max(1.0), "rank {rank} p{p}[{i}]: {x} vs {want}");
            }
        }
    }
    for mode in [Mode::Buckets, Mode::Overlap { report_all: true }, Mode::Overlap { report_all: false }] {
        let got = reduce(mode);
        for (rank, (a, b)) in got.iter().zip(&plain).enumerate() {
            for (p, (x, y)) in a.iter().zip(b).enumerate() {
                let same = x.iter().zip(y).all(|(u, v)| u.to_bits() == v.to_bits());
                assert!(same, "{mode:?}: rank {rank} p{p} differs from the per-parameter all-reduce: {x:?} vs {y:?}");
            }
        }
    }
}

#[test]
fn reporting_a_gradient_twice_is_an_error() {
    let comms = LocalCommunicator::world(2, Duration::from_secs(30));
    let strategy =
        MegatronStrategy::new(StrategyConfig { overlap_grad_reduce: true, ..StrategyConfig::default() }).unwrap();
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|comm| {
                let ctx = strategy.build_context(comm.clone()).unwrap();
                let (strategy, backend) = (&strategy, backend.clone());
                s.spawn(move || {
                    let mut ps = params(ctx.rank);
                    let view: Vec<&Param> = ps.iter().collect();
                    let mut ddp = strategy.grad_sync(&view, backend.clone(), &ctx).unwrap().expect("dp = 2 reduces");
                    ddp.grads_ready(&[view[5]]).unwrap();
                    let err = ddp.grads_ready(&[view[5]]).err().unwrap().to_string();
                    let mut refs: Vec<&mut Param> = ps.iter_mut().collect();
                    ddp.finish(&mut refs, backend.as_ref()).unwrap();
                    err
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in errors {
        assert!(e.contains("`p5` reported ready twice") && e.contains("last microbatch"), "{e}");
    }
}
