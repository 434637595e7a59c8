//! bf16 gradient buckets (`--grad-reduce-in-bf16`, SPEC §5.7/§6.7) with real thread ranks: at
//! dp3 (where the `1/3` pre-scale rounds in bf16, so the bucket dtype shows) every reduced
//! gradient is `bf16(Σ_r bf16(g_r · 1/3))`, the inner sum in fp32 in rank order — Megatron's bf16
//! buffer, scaled in bf16 and summed by our communicator in fp32, rounded once. The all-reduce
//! (without the distributed optimizer), the reduce-scatter (with it; zeros outside the rank's
//! range) and the overlapped variants give bitwise those values, and the gradients stay bf16.

use half::bf16;
use megatron_comm_local::LocalCommunicator;
use megatron_core::ParamLayout;
use megatron_core::{Backend, DType, DeviceTensor, GradSync, HostBuffer, ParallelContext, ParallelStrategy, Param};
use megatron_cpu::CpuBackend;
use megatron_parallel::{DdpOptions, DdpReducer, MegatronStrategy, StrategyConfig};
use std::sync::Arc;
use std::time::Duration;

const SHAPES: [&[usize]; 4] = [&[3, 4], &[7], &[2, 5], &[5]];
const DP: usize = 3;

fn grad_value(rank: usize, param: usize, i: usize) -> bf16 {
    bf16::from_f32(((rank * 97 + param * 31 + i * 7) as f32 * 0.618_034).sin() * (1.0 + rank as f32 * 3.0))
}

fn params(rank: usize) -> Vec<Param> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(p, shape)| {
            let n: usize = shape.iter().product();
            Param {
                name: format!("p{p}"),
                value: DeviceTensor::from_host_buffer(HostBuffer::BF16(vec![bf16::ZERO; n]), shape).unwrap(),
                grad: DeviceTensor::from_host_buffer(
                    HostBuffer::BF16((0..n).map(|i| grad_value(rank, p, i)).collect()),
                    shape,
                )
                .unwrap(),
                layout: ParamLayout::replicated(shape, false),
            }
        })
        .collect()
}

/// The reduced gradients of every rank (as f32, exact) for `options`.
fn reduce(options: DdpOptions) -> Vec<Vec<Vec<f32>>> {
    let comms = LocalCommunicator::world(DP, Duration::from_secs(30));
    let strategy = MegatronStrategy::new(StrategyConfig::default()).unwrap();
    let strategy = &strategy;
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|comm| {
                let ctx = strategy.build_context(comm.clone()).unwrap();
                s.spawn(move || run_rank(options, ctx))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn run_rank(options: DdpOptions, ctx: ParallelContext) -> Vec<Vec<f32>> {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut ps = params(ctx.rank);
    let mut refs: Vec<&mut Param> = ps.iter_mut().collect();
    let view: Vec<&Param> = refs.iter().map(|p| &**p).collect();
    let mut ddp = DdpReducer::new(&view, options, backend.clone(), &ctx).unwrap();
    if options.overlap_grad_reduce {
        for p in view.iter().rev() {
            ddp.grads_ready(&[p]).unwrap();
        }
    }
    ddp.finish(&mut refs, backend.as_ref()).unwrap();
    ps.iter()
        .map(|p| {
            assert_eq!(p.grad.dtype(), DType::BF16, "{}: the gradient buffer must stay bf16", p.name);
            p.grad.host_buffer().unwrap().to_f32_vec()
        })
        .collect()
}

#[test]
fn bf16_buckets_are_scaled_and_reduced_in_bf16() {
    // Megatron's bf16 buffer: g · (1/3) rounded to bf16 (the scale itself is applied in f32).
    let want: Vec<Vec<f32>> = SHAPES
        .iter()
        .enumerate()
        .map(|(p, shape)| {
            let n: usize = shape.iter().product();
            (0..n)
                .map(|i| {
                    let sum = (0..DP).fold(0.0f32, |acc, r| {
                        acc + bf16::from_f32(grad_value(r, p, i).to_f32() * (1.0 / DP as f32)).to_f32()
                    });
                    bf16::from_f32(sum).to_f32()
                })
                .collect()
        })
        .collect();
    // An fp32 bucket would give bf16(Σ g·1/3) instead: make sure the data tell them apart.
    let fp32_bucket_differs = SHAPES.iter().enumerate().any(|(p, shape)| {
        (0..shape.iter().product::<usize>()).any(|i| {
            let s = (0..DP).fold(0.0f32, |acc, r| acc + grad_value(r, p, i).to_f32() * (1.0 / DP as f32));
            bf16::from_f32(s).to_f32() != want[p][i]
        })
    });
    assert!(fp32_bucket_differs, "test data must separate a bf16 bucket from an fp32 one");
    for overlap in [false, true] {
        let bucket_size = Some(10);
        let all = reduce(DdpOptions { bucket_size, overlap_grad_reduce: overlap, ..Default::default() });
        for (rank, got) in all.iter().enumerate() {
            assert_eq!(got, &want, "all-reduce, overlap {overlap}, rank {rank}");
        }
        let options = DdpOptions { bucket_size, overlap_grad_reduce: overlap, shard_for_distributed_optimizer: true };
        let sharded = reduce(options);
        // Each element is reduced on exactly one rank (zeros elsewhere): the sum over ranks is
        // the all-reduced value, and every nonzero value equals it.
        for (p, w) in want.iter().enumerate() {
            for (i, &v) in w.iter().enumerate() {
                let owners: Vec<f32> = sharded.iter().map(|g| g[p][i]).filter(|&x| x != 0.0).collect();
                assert!(owners.len() <= 1, "p{p}[{i}] owned by several ranks: {owners:?}");
                assert_eq!(owners.first().copied().unwrap_or(0.0), v, "reduce-scatter, overlap {overlap}: p{p}[{i}]");
            }
        }
    }
}
