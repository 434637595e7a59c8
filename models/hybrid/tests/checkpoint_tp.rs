//! The mixer's tensor-parallel layout in checkpoints: `in_proj` ([z | x | B | C | dt]) and the
//! conv weight/bias ([x | B | C]) are split per component (`ParamLayout::tp_blocks`), so a
//! rank's tensor is several slices of the global one. Every parameter of a tp = 2 hybrid model
//! is set to a function of its global element index, saved by both ranks, and loaded into a
//! tp = 1 model and back into tp = 2 ones: every element lands where it belongs.

use megatron_checkpoint::CheckpointMeta;
use megatron_comm_local::LocalCommunicator;
use megatron_core::{Backend, HostBuffer, Model, ParallelContext, Param, RankGrid};
use megatron_cpu::CpuBackend;
use megatron_hybrid::{HybridConfig, HybridModel};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

fn config() -> HybridConfig {
    let mut c = HybridConfig::new("M*-M", 16, 4, 8, 45);
    c.mamba_num_heads = Some(4);
    c.mamba_head_dim = 8;
    c.mamba_num_groups = 2;
    c.mamba_state_dim = 4;
    c.make_vocab_size_divisible_by = 32; // 64 rows at tp 1 and tp 2
    c
}

/// The value of global element `i` of parameter `name`.
fn f(name: &str, i: usize) -> f32 {
    let h = name.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32)) % 1000;
    h as f32 + i as f32 * 1e-3
}

/// The global index of every local element of `p` (from its shard boxes, split on one axis).
fn global_indices(p: &Param) -> Vec<usize> {
    let (l, g) = (p.value.shape().to_vec(), &p.layout.global_shape);
    let mut idx = vec![usize::MAX; l.iter().product()];
    for (local_at, slice) in p.layout.shard_boxes(&l) {
        let axis = p.layout.tp_axis.filter(|_| p.layout.tp_size > 1).unwrap_or(0);
        let (outer, inner): (usize, usize) = (g[..axis].iter().product(), g[axis + 1..].iter().product());
        for o in 0..outer {
            for j in 0..slice[axis].1 {
                for k in 0..inner {
                    idx[(o * l[axis] + local_at + j) * inner + k] = (o * g[axis] + slice[axis].0 + j) * inner + k;
                }
            }
        }
    }
    idx
}

fn model(ctx: ParallelContext) -> (HybridModel, Arc<dyn Backend>) {
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    (HybridModel::new(config(), "hybrid", be.clone(), ctx).unwrap(), be)
}

/// Runs `body(ctx)` on the two ranks of a tp = 2 world.
fn tp2(body: impl Fn(ParallelContext) + Sync) {
    let grid = RankGrid::new(2, 2, 1, 1).unwrap();
    let comms = LocalCommunicator::world(2, Duration::from_secs(60));
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().enumerate().map(|(r, c)| (grid.context(r, c.clone()), &body)).collect();
        let hs: Vec<_> = hs.into_iter().map(|(ctx, b)| s.spawn(move || b(ctx))).collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
    });
}

fn check(m: &HybridModel, be: &dyn Backend) {
    for p in m.params() {
        let got = be.to_host(&p.value).unwrap().to_f32_vec();
        for (v, i) in got.iter().zip(global_indices(p)) {
            assert_eq!(*v, f(&p.name, i), "`{}` element {i} (tp rank {})", p.name, p.layout.tp_rank);
        }
    }
}

#[test]
fn tp_blocked_parameters_reshard_through_checkpoints() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hybrid_checkpoint_tp");
    let _ = std::fs::remove_dir_all(&dir);
    tp2(|ctx| {
        let (mut m, be) = model(ctx.clone());
        let blocked = m.params().iter().filter(|p| !p.layout.tp_blocks.is_empty()).count();
        assert_eq!(blocked, 2 * 3, "in_proj, conv weight and conv bias of both mixers are blocked");
        for p in m.params_mut() {
            let v: Vec<f32> = global_indices(p).into_iter().map(|i| f(&p.name, i)).collect();
            p.value = be.from_host(HostBuffer::F32(v), p.value.shape()).unwrap();
        }
        megatron_checkpoint::save(&dir, 1, &m.params(), None, CheckpointMeta::default(), be.as_ref(), &ctx).unwrap();
    });
    let (mut one, be) = model(ParallelContext::single());
    megatron_checkpoint::load(&dir, None).unwrap().load_params(&mut one.params_mut(), be.as_ref()).unwrap();
    check(&one, be.as_ref());
    tp2(|ctx| {
        let (mut m, be) = model(ctx);
        megatron_checkpoint::load(&dir, None).unwrap().load_params(&mut m.params_mut(), be.as_ref()).unwrap();
        check(&m, be.as_ref());
    });
    let _ = std::fs::remove_dir_all(&dir);
}
