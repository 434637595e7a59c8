//! Global gradient norm and clipping (SPEC §6.6) on the CPU backend, including the TP rule
//! that replicated params count on TP rank 0 only.

use megatron_core::anyhow::{bail, Result};
use megatron_core::{
    Backend, Communicator, DeviceTensor, Group, HostBuffer, ParallelContext, Param, ParamLayout, RankGrid, ReduceOp,
};
use megatron_cpu::CpuBackend;
use megatron_optim::{clip_grad_norm, grad_norm, grads_have_inf_or_nan, is_finite_norm};
use std::sync::{Arc, Mutex};

/// One endpoint of a pretend world: a SUM adds what the other ranks would have contributed
/// (`others`), a MAX takes the max with it, and every reduced group is recorded.
struct FakeComm {
    rank: usize,
    world: usize,
    others: f64,
    groups: Mutex<Vec<Vec<usize>>>,
}

impl Communicator for FakeComm {
    fn name(&self) -> &str {
        "fake"
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn all_reduce(&self, _: &Group, _: &mut DeviceTensor, _: ReduceOp) -> Result<()> {
        bail!("not used")
    }
    fn all_reduce_f64(&self, group: &Group, values: &mut [f64], op: ReduceOp) -> Result<()> {
        self.groups.lock().unwrap().push(group.ranks.clone());
        for v in values {
            *v = match op {
                ReduceOp::Sum => *v + self.others,
                ReduceOp::Max => v.max(self.others),
            };
        }
        Ok(())
    }
    fn all_gather(&self, _: &Group, _: &DeviceTensor, _: &mut DeviceTensor) -> Result<()> {
        bail!("not used")
    }
    fn reduce_scatter(&self, _: &Group, _: &DeviceTensor, _: &mut DeviceTensor, _: ReduceOp) -> Result<()> {
        bail!("not used")
    }
    fn broadcast(&self, _: &Group, _: &mut DeviceTensor, _: usize) -> Result<()> {
        bail!("not used")
    }
    fn send(&self, _: &Group, _: &DeviceTensor, _: usize) -> Result<()> {
        bail!("not used")
    }
    fn recv(&self, _: &Group, _: &mut DeviceTensor, _: usize) -> Result<()> {
        bail!("not used")
    }
    fn barrier(&self, _: &Group) -> Result<()> {
        bail!("not used")
    }
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
    let b = CpuBackend::new();
    let grid = RankGrid::new(2, 2, 1, 1).unwrap();
    // Grads: replicated [3, 4] (25), sharded [1, 2] (5); the other rank's share is 20.
    for (rank, local, others) in [(0usize, 30.0, 20.0), (1, 5.0, 45.0)] {
        let comm = Arc::new(FakeComm { rank, world: 2, others, groups: Mutex::new(Vec::new()) });
        let ctx = grid.context(rank, comm.clone());
        let rep = param(&b, "norm.weight", &[3.0, 4.0], None);
        let shard = param(&b, "fc1.weight", &[1.0, 2.0], Some(0));
        let norm = grad_norm(&[&rep, &shard], &b, &ctx).unwrap();
        assert!((norm - (local + others).sqrt()).abs() < 1e-12, "rank {rank}: {norm}");
        assert_eq!(*comm.groups.lock().unwrap(), [vec![0, 1]], "reduced over the model-parallel group");
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
    let comm = Arc::new(FakeComm { rank: 0, world: 2, others: 1.0, groups: Mutex::new(Vec::new()) });
    let ctx = RankGrid::new(2, 2, 1, 1).unwrap().context(0, comm);
    assert!(grads_have_inf_or_nan(&[&fine], &b, &ctx).unwrap());
}
