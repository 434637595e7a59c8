//! The distributed optimizer with half (bf16/fp16) parameters, ranks as threads: each rank
//! keeps fp32 main values only for its shard (its main-parameter count is ≈ N/dp, not N), and
//! the half parameters, the per-parameter state (`exp_avg`, `exp_avg_sq`, `main_param`) and
//! a resumed step are bitwise those of the non-sharded path (the mixed-precision Adam with a
//! full fp32 main copy) — synchronously and with `--overlap-param-gather`, across a skipped
//! step, and through checkpoint states moved between the two.

use megatron_core::{Backend, DType, DeviceTensor, Group, HostBuffer, Optimizer, OptimizerState, Param, ParamLayout};
use megatron_optim::{Adam, AdamConfig, DistributedOptimizer, MixedPrecisionOptimizer, ShardedBucket};
use std::sync::Arc;

/// Three parameters (61 elements) in `dtype`, fp32 gradients of step `step`.
fn params(bk: &dyn Backend, step: usize, dtype: DType) -> Vec<Param> {
    let shapes: [(&str, Vec<usize>, bool); 3] =
        [("a", vec![7, 5], false), ("b", vec![14], true), ("c", vec![4, 3], false)];
    shapes
        .iter()
        .enumerate()
        .map(|(i, (name, shape, no_wd))| {
            let n: usize = shape.iter().product();
            let v: Vec<f32> = (0..n).map(|j| ((i * 31 + j * 7) % 13) as f32 * 0.1 - 0.6).collect();
            let g: Vec<f32> = (0..n).map(|j| (((i + step) * 17 + j * 5) % 11) as f32 * 0.05 - 0.25).collect();
            let wide = bk.from_host(HostBuffer::F32(v), shape).unwrap();
            let mut value = bk.zeros(shape, dtype).unwrap();
            bk.cast(&wide, &mut value).unwrap();
            Param {
                name: name.to_string(),
                value,
                grad: bk.from_host(HostBuffer::F32(g), shape).unwrap(),
                layout: ParamLayout::replicated(shape, *no_wd),
            }
        })
        .collect()
}

fn set_grads(bk: &dyn Backend, ps: &mut [Param], step: usize) {
    for (p, fresh) in ps.iter_mut().zip(params(bk, step, DType::F32)) {
        bk.copy(&fresh.grad, &mut p.grad).unwrap();
    }
}

/// Values as bits (bf16/fp16 widened exactly), for bitwise comparisons.
fn bits(bk: &dyn Backend, t: &DeviceTensor) -> Vec<u32> {
    bk.to_host(t).unwrap().to_f32_vec().iter().map(|x| x.to_bits()).collect()
}

fn values(bk: &dyn Backend, ps: &[Param]) -> Vec<Vec<u32>> {
    ps.iter().map(|p| bits(bk, &p.value)).collect()
}

fn state_bits(bk: &dyn Backend, s: &OptimizerState) -> Vec<(String, Vec<u32>)> {
    let mut v: Vec<_> = s.tensors.iter().map(|(n, t)| (n.clone(), bits(bk, t))).collect();
    v.sort();
    v
}

fn step(opt: &mut dyn Optimizer, bk: &dyn Backend, ps: &mut [Param]) {
    opt.step(&mut ps.iter_mut().collect::<Vec<_>>(), 1e-2, 0.1, bk).unwrap();
}

/// The reducer's layout of the three parameters for `dp` ranks: two buckets, the second one
/// padded so its ranges split a parameter.
fn buckets(dp: usize) -> Vec<ShardedBucket> {
    vec![
        ShardedBucket {
            params: vec![("c".into(), 0, 12), ("b".into(), 12, 14)],
            padded_numel: 26usize.div_ceil(dp) * dp,
        },
        ShardedBucket { params: vec![("a".into(), 0, 35)], padded_numel: 35usize.div_ceil(dp) * dp },
    ]
}

const STEPS: usize = 5;
const SKIPPED: usize = 2;

/// The non-sharded path on one rank: per step the half values and the state.
/// Per step: every parameter's values as bits, and the per-parameter state as bits.
type Trace = (Vec<Vec<Vec<u32>>>, Vec<Vec<(String, Vec<u32>)>>);

fn reference(bk: &dyn Backend, dtype: DType) -> Trace {
    let mut ps = params(bk, 0, dtype);
    let mut mp = MixedPrecisionOptimizer::new(Box::new(Adam::new(AdamConfig::default()).unwrap()));
    let (mut vals, mut states) = (Vec::new(), Vec::new());
    for s in 0..STEPS {
        set_grads(bk, &mut ps, s);
        if s != SKIPPED {
            step(&mut mp, bk, &mut ps);
        }
        vals.push(values(bk, &ps));
        states.push(state_bits(bk, &mp.state(bk).unwrap()));
    }
    assert_eq!(mp.main_numel(), 61, "the non-sharded path keeps a full fp32 copy");
    (vals, states)
}

#[test]
fn sharded_main_params_are_bitwise_the_full_copy_and_hold_one_shard() {
    let bk: Arc<dyn Backend> = Arc::new(megatron_cpu::CpuBackend::new());
    for dtype in [DType::BF16, DType::F16] {
        let (want_vals, want_states) = reference(bk.as_ref(), dtype);
        for dp in [2usize, 4] {
            for overlap in [false, true] {
                let name = format!("{dtype} dp{dp} overlap {overlap}");
                let comms = megatron_comm_local::LocalCommunicator::world(dp, std::time::Duration::from_secs(30));
                let mains: Vec<usize> = std::thread::scope(|sc| {
                    let hs: Vec<_> = comms
                        .iter()
                        .map(|comm| {
                            let (comm, bk, name) = (comm.clone(), bk.clone(), name.clone());
                            let (want_vals, want_states) = (&want_vals, &want_states);
                            sc.spawn(move || {
                                let bk = bk.as_ref();
                                let mut ps = params(bk, 0, dtype);
                                let view: Vec<&Param> = ps.iter().collect();
                                let group = Group::new("dp", (0..dp).collect());
                                let mut opt =
                                    DistributedOptimizer::new(AdamConfig::default(), buckets(dp), comm, group, &view)
                                        .unwrap();
                                let hook = overlap.then(|| {
                                    opt.overlap_param_gather(Arc::new(megatron_cpu::CpuBackend::new())).unwrap()
                                });
                                for s in 0..STEPS {
                                    set_grads(bk, &mut ps, s);
                                    if s != SKIPPED {
                                        step(&mut opt, bk, &mut ps);
                                    }
                                    if let Some(h) = &hook {
                                        // The next forward's pre-hooks (half values gathered as they are).
                                        h.lock().unwrap().finish(&mut ps.iter_mut().collect::<Vec<_>>()).unwrap();
                                    }
                                    assert_eq!(ps[0].value.dtype(), dtype);
                                    assert_eq!(values(bk, &ps), want_vals[s], "{name} step {s}: half parameters");
                                    let st = state_bits(bk, &opt.state(bk).unwrap());
                                    assert_eq!(st, want_states[s], "{name} step {s}: gathered per-parameter state");
                                }
                                opt.main_numel()
                            })
                        })
                        .collect();
                    hs.into_iter().map(|h| h.join().unwrap()).collect()
                });
                assert_eq!(mains.iter().sum::<usize>(), 61, "{name}: every element's main value is held once");
                for m in &mains {
                    assert!(*m <= 35usize.div_ceil(dp) + 26usize.div_ceil(dp), "{name}: a rank holds {m} > its shard");
                }
                println!("{name}: per-rank fp32 main values {mains:?} (N = 61; the non-sharded path: 61 per rank)");
            }
        }
    }
}

/// States move both ways: the sharded state (dp2) resumes in the mixed-precision Adam on one
/// rank, and that one's state resumes sharded at dp4, each next step bitwise the uninterrupted
/// non-sharded run's.
#[test]
fn half_states_move_between_sharded_and_full_main_copies() {
    let bk: Arc<dyn Backend> = Arc::new(megatron_cpu::CpuBackend::new());
    let dtype = DType::BF16;
    let (want_vals, want_states) = reference(bk.as_ref(), dtype);
    let want = &want_vals;
    let run_sharded = |dp: usize, from: Option<(OptimizerState, Vec<Param>)>, first: usize, last: usize| {
        let comms = megatron_comm_local::LocalCommunicator::world(dp, std::time::Duration::from_secs(30));
        let outs: Vec<(OptimizerState, Vec<Param>)> = std::thread::scope(|sc| {
            let hs: Vec<_> = comms
                .iter()
                .map(|comm| {
                    let (comm, bk) = (comm.clone(), bk.clone());
                    let from = from.as_ref().map(|(s, ps)| {
                        let bk = bk.as_ref();
                        let copy = |t: &DeviceTensor| {
                            let mut o = bk.zeros(t.shape(), t.dtype()).unwrap();
                            bk.copy(t, &mut o).unwrap();
                            o
                        };
                        let st = OptimizerState {
                            scalars: s.scalars.clone(),
                            tensors: s.tensors.iter().map(|(n, t)| (n.clone(), copy(t))).collect(),
                        };
                        let vals: Vec<DeviceTensor> = ps.iter().map(|p| copy(&p.value)).collect();
                        (st, vals)
                    });
                    sc.spawn(move || {
                        let bk = bk.as_ref();
                        let mut ps = params(bk, 0, dtype);
                        let view: Vec<&Param> = ps.iter().collect();
                        let group = Group::new("dp", (0..dp).collect());
                        let mut opt =
                            DistributedOptimizer::new(AdamConfig::default(), buckets(dp), comm, group, &view).unwrap();
                        if let Some((st, vals)) = from {
                            for (p, v) in ps.iter_mut().zip(vals) {
                                p.value = v; // the checkpoint's (rounded) weights
                            }
                            opt.load_state(st, &ps.iter().collect::<Vec<_>>(), bk).unwrap();
                        }
                        for (s, want_s) in want.iter().enumerate().take(last).skip(first) {
                            set_grads(bk, &mut ps, s);
                            if s != SKIPPED {
                                step(&mut opt, bk, &mut ps);
                            }
                            assert_eq!(&values(bk, &ps), want_s, "dp{dp} step {s}");
                        }
                        (opt.state(bk).unwrap(), ps)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        outs.into_iter().next().unwrap()
    };
    let bk = bk.as_ref();
    // dp2 sharded, steps 0..3 (2 skipped), then the full main copy on one rank for step 3.
    let (st, mut ps) = run_sharded(2, None, 0, 3);
    assert_eq!(state_bits(bk, &st), want_states[2]);
    let mut mp = MixedPrecisionOptimizer::new(Box::new(Adam::new(AdamConfig::default()).unwrap()));
    mp.load_state(st, &ps.iter().collect::<Vec<_>>(), bk).unwrap();
    set_grads(bk, &mut ps, 3);
    step(&mut mp, bk, &mut ps);
    assert_eq!(values(bk, &ps), want_vals[3], "dp2 sharded -> full main copy: step 3");
    // ... and back into the sharded optimizer at dp4 for step 4.
    let st = mp.state(bk).unwrap();
    assert_eq!(state_bits(bk, &st), want_states[3]);
    let (st, _) = run_sharded(4, Some((st, ps)), 4, 5);
    assert_eq!(state_bits(bk, &st), want_states[4], "full main copy -> dp4 sharded: state after step 4");
}
