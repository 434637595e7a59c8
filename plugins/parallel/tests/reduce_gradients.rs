//! Data-parallel gradient averaging of the `megatron` strategy (SPEC §5.6): pre-scale by
//! `1/(dp*cp)`, SUM all-reduce over the DP×CP group, nothing at all when that group is one rank.

mod common;

use common::FakeComm;
use megatron_core::{DeviceTensor, HostBuffer, ParallelStrategy, Param, ParamLayout, ReduceOp};
use megatron_parallel::{MegatronStrategy, StrategyConfig};
use std::sync::Arc;

fn param(name: &str, grad: &[f32]) -> Param {
    let t = |v: &[f32]| DeviceTensor::from_host_buffer(HostBuffer::F32(v.to_vec()), &[v.len()]).unwrap();
    Param {
        name: name.into(),
        value: t(&vec![0.0; grad.len()]),
        grad: t(grad),
        layout: ParamLayout::replicated(&[grad.len()], false),
    }
}

fn strategy(tp: usize, cp: usize) -> MegatronStrategy {
    let config =
        StrategyConfig { tensor_model_parallel_size: tp, context_parallel_size: cp, ..StrategyConfig::default() };
    MegatronStrategy::new(config).unwrap()
}

#[test]
fn replicas_with_equal_grads_keep_them_after_averaging() {
    // W=4, tp2 dp2: rank 1's DP group is [1, 3]. FakeComm's SUM multiplies by the group size,
    // i.e. both replicas hold the same grads, whose average is the grads themselves.
    let comm = Arc::new(FakeComm::new(1, 4));
    let s = strategy(2, 1);
    let ctx = s.build_context(comm.clone()).unwrap();
    let mut a = param("a", &[1.0, -2.0, 0.5]);
    let mut b = param("b", &[3.0]);
    s.reduce_gradients(&mut [&mut a, &mut b], &megatron_cpu::CpuBackend::new(), &ctx).unwrap();
    assert_eq!(a.grad.host_f32().unwrap(), [1.0, -2.0, 0.5]);
    assert_eq!(b.grad.host_f32().unwrap(), [3.0]);
    let calls = comm.calls.lock().unwrap();
    assert_eq!(calls.len(), 2, "one all-reduce per parameter");
    assert!(calls.iter().all(|(_, ranks, op)| ranks == &[1, 3] && *op == ReduceOp::Sum), "{calls:?}");
}

#[test]
fn grads_are_pre_scaled_by_one_over_dp_times_cp() {
    // W=8, tp2 cp2 dp2: the DP x CP group of rank 0 is [0, 2, 4, 6]. The other ranks contribute
    // zeros, so what is left after the SUM is this rank's pre-scaled share.
    let comm = Arc::new(FakeComm::lonely(0, 8));
    let s = strategy(2, 2);
    let ctx = s.build_context(comm.clone()).unwrap();
    let mut a = param("a", &[8.0, 4.0]);
    s.reduce_gradients(&mut [&mut a], &megatron_cpu::CpuBackend::new(), &ctx).unwrap();
    assert_eq!(a.grad.host_f32().unwrap(), [2.0, 1.0]);
    let calls = comm.calls.lock().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!((calls[0].0.as_str(), calls[0].1.as_slice()), ("dp-cp", &[0, 2, 4, 6][..]));
}

#[test]
fn one_replica_is_a_no_op() {
    let comm = Arc::new(FakeComm::new(1, 2));
    let s = strategy(2, 1);
    let ctx = s.build_context(comm.clone()).unwrap();
    let mut a = param("a", &[1.5]);
    s.reduce_gradients(&mut [&mut a], &megatron_cpu::CpuBackend::new(), &ctx).unwrap();
    assert_eq!(a.grad.host_f32().unwrap(), [1.5]);
    assert!(comm.calls.lock().unwrap().is_empty());
}

#[test]
fn expert_grads_are_summed_over_the_expert_data_parallel_group() {
    // W=4, dp4 ep2: rank 1 holds experts with rank 3 (EDP group [1, 3]); the dense grad goes
    // over [0, 1, 2, 3]. Both are pre-scaled by 1/dp (SPEC §5.6): the others contribute zeros.
    let comm = Arc::new(FakeComm::lonely(1, 4));
    let config = StrategyConfig { expert_model_parallel_size: 2, ..StrategyConfig::default() };
    let s = MegatronStrategy::new(config).unwrap();
    let ctx = s.build_context(comm.clone()).unwrap();
    assert_eq!((ctx.ep_group.ranks.as_slice(), ctx.edp_group.ranks.as_slice()), (&[0, 1][..], &[1, 3][..]));
    let mut dense = param("dense", &[8.0]);
    let mut expert = param("expert", &[4.0]);
    expert.layout.expert_parallel = true;
    s.reduce_gradients(&mut [&mut dense, &mut expert], &megatron_cpu::CpuBackend::new(), &ctx).unwrap();
    assert_eq!(dense.grad.host_f32().unwrap(), [2.0]);
    assert_eq!(expert.grad.host_f32().unwrap(), [1.0]);
    let calls = comm.calls.lock().unwrap();
    let groups: Vec<&[usize]> = calls.iter().map(|(_, ranks, _)| ranks.as_slice()).collect();
    assert_eq!(groups, [&[0, 1, 2, 3][..], &[1, 3][..]]);
}
