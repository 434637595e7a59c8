//! `DistributedOptimizer::overlap_param_gather` with ranks as threads: after a step the
//! parameters keep their old values until the forward pre-hook asks for them; asking for one
//! module's parameters writes exactly those (the others stay pending), and every written value
//! is bitwise the one the synchronous all-gather writes. Half parameters with overlap:
//! tests/dist_opt_half.rs.

use megatron_core::{Backend, Group, HostBuffer, Optimizer, Param, ParamLayout};
use megatron_optim::{AdamConfig, DistributedOptimizer, ShardedBucket};
use std::sync::Arc;

fn params(bk: &dyn Backend, step: usize) -> Vec<Param> {
    let shapes: [(&str, Vec<usize>); 3] = [("a", vec![7, 5]), ("b", vec![14]), ("c", vec![4, 3])];
    shapes
        .iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let n: usize = shape.iter().product();
            let v: Vec<f32> = (0..n).map(|j| ((i * 31 + j * 7) % 13) as f32 * 0.1 - 0.6).collect();
            let g: Vec<f32> = (0..n).map(|j| (((i + step) * 17 + j * 5) % 11) as f32 * 0.05 - 0.25).collect();
            Param {
                name: name.to_string(),
                value: bk.from_host(HostBuffer::F32(v), shape).unwrap(),
                grad: bk.from_host(HostBuffer::F32(g), shape).unwrap(),
                layout: ParamLayout::replicated(shape, false),
            }
        })
        .collect()
}

#[test]
fn pre_hook_writes_only_the_asked_parameters_and_the_same_bits() {
    let bk: Arc<dyn Backend> = Arc::new(megatron_cpu::CpuBackend::new());
    let host = |t: &megatron_core::DeviceTensor| bk.to_host(t).unwrap().to_f32_vec();
    let dp = 2;
    // The reducer's layout for dp 2: bucket 0 = c, b (backward order), bucket 1 = a.
    let buckets = vec![
        ShardedBucket { params: vec![("c".into(), 0, 12), ("b".into(), 12, 14)], padded_numel: 26 },
        ShardedBucket { params: vec![("a".into(), 0, 35)], padded_numel: 36 },
    ];
    let comms = megatron_comm_local::LocalCommunicator::world(dp, std::time::Duration::from_secs(30));
    std::thread::scope(|s| {
        for comm in &comms {
            let (comm, buckets, bk) = (comm.clone(), buckets.clone(), bk.clone());
            s.spawn(move || {
                let group = Group::new("dp", (0..dp).collect());
                let (mut sync_ps, mut over_ps) = (params(bk.as_ref(), 0), params(bk.as_ref(), 0));
                let view: Vec<&Param> = sync_ps.iter().collect();
                let cfg = AdamConfig::default();
                let mut sync =
                    DistributedOptimizer::new(cfg, buckets.clone(), comm.clone(), group.clone(), &view).unwrap();
                let mut over = DistributedOptimizer::new(cfg, buckets, comm, group, &view).unwrap();
                let hook = over.overlap_param_gather(bk.clone()).unwrap();
                for step in 0..3 {
                    // What every parameter holds once the previous step's gathers landed.
                    let old: Vec<Vec<f32>> = sync_ps.iter().map(|p| host(&p.value)).collect();
                    for ps in [&mut sync_ps, &mut over_ps] {
                        for (p, fresh) in ps.iter_mut().zip(params(bk.as_ref(), step)) {
                            bk.copy(&fresh.grad, &mut p.grad).unwrap();
                        }
                    }
                    sync.step(&mut sync_ps.iter_mut().collect::<Vec<_>>(), 1e-2, 0.1, bk.as_ref()).unwrap();
                    over.step(&mut over_ps.iter_mut().collect::<Vec<_>>(), 1e-2, 0.1, bk.as_ref()).unwrap();
                    let want: Vec<Vec<f32>> = sync_ps.iter().map(|p| host(&p.value)).collect();
                    let now = |ps: &[Param]| ps.iter().map(|p| host(&p.value)).collect::<Vec<_>>();
                    assert_eq!(now(&over_ps), old, "step {step}: nothing is written before a forward asks");
                    assert_ne!(want, old, "step {step}: the step must change the parameters");
                    // The "first module" uses `a` only (bucket 1): b and c stay pending.
                    let (a, rest) = over_ps.split_at_mut(1);
                    hook.lock().unwrap().before_forward(&mut [&mut a[0]]).unwrap();
                    assert_eq!(host(&a[0].value), want[0], "step {step}: `a` after its pre-hook");
                    assert_eq!(now(rest), old[1..], "step {step}: b, c are written before they were asked for");
                    // A second call for `a` changes nothing; `b` alone comes from bucket 0.
                    hook.lock().unwrap().before_forward(&mut [&mut a[0], &mut rest[0]]).unwrap();
                    assert_eq!(host(&rest[0].value), want[1]);
                    assert_eq!(host(&rest[1].value), old[2], "step {step}: c was not asked for");
                    if step == 1 {
                        // The next step first writes what no forward asked for (here: c).
                        continue;
                    }
                    hook.lock().unwrap().finish(&mut over_ps.iter_mut().collect::<Vec<_>>()).unwrap();
                    assert_eq!(now(&over_ps), want, "step {step}: bitwise the synchronous all-gather");
                }
            });
        }
    });
}
