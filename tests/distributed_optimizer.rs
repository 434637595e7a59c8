//! `--use-distributed-optimizer` (ZeRO-1, SPEC §5.7): reduce-scattered gradients, Adam state
//! for the local shard only, all-gathered parameters. The tiny GPT for 20 steps matches the
//! single-rank run (losses and grad norms within 1e-5 relative) at dp1, dp2, dp4, tp2·dp2 and
//! pp2·dp2 (tied embedding in its own bucket), with and without `--overlap-grad-reduce`; and
//! checkpoints carry the optimizer state per parameter, so a run resumes across layouts with
//! the distributed optimizer on either side (dp4 → dp2 → dp1 without it → tp2·pp2·dp2).

mod common;
use common::*;

/// Same model for every layout (vocab 128 stays unpadded up to tp = 2), Adam with a large LR
/// so the moments matter after a resume.
fn flags(extra: &str) -> Vec<String> {
    tiny_with(&format!(
        "--vocab-size 128 --make-vocab-size-divisible-by 64 --hidden-dropout 0 --attention-dropout 0 \
         --global-batch-size 8 --train-iters 20 --eval-interval 20 --eval-iters 1 --log-interval 10 {extra}"
    ))
}

fn layout(tp: usize, pp: usize, dp: usize) -> String {
    format!("--nproc {} --tensor-model-parallel-size {tp} --pipeline-model-parallel-size {pp}", tp * pp * dp)
}

const DIST: &str = "--use-distributed-optimizer";

#[test]
fn distributed_optimizer_matches_the_single_rank_run() {
    let reference = pretrain(&flags("")).unwrap();
    assert_eq!(reference.losses.len(), 20);
    for (tp, pp, dp) in [(1, 1, 1), (1, 1, 2), (1, 1, 4), (2, 1, 2), (1, 2, 2)] {
        // Small buckets with overlap: several reduce-scatters run during backward.
        for overlap in ["", "--overlap-grad-reduce --ddp-bucket-size 1500"] {
            let run = pretrain(&flags(&format!("{} {DIST} {overlap}", layout(tp, pp, dp))))
                .unwrap_or_else(|e| panic!("tp{tp} pp{pp} dp{dp} {overlap}: {e:#}"));
            let (loss, norm) =
                (max_rel(&run.losses, &reference.losses), max_rel(&run.grad_norms, &reference.grad_norms));
            println!("dist-opt tp{tp} pp{pp} dp{dp} [{overlap}]: max rel diff loss {loss:.2e}, grad norm {norm:.2e}");
            assert!(loss < 1e-5 && norm < 1e-5, "tp{tp} pp{pp} dp{dp} [{overlap}]: loss {loss:.2e}, norm {norm:.2e}");
        }
    }
}

#[test]
fn optimizer_state_resumes_across_layouts_with_the_distributed_optimizer() {
    let straight = pretrain(&flags("")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // A chain of save/load layouts; each hop trains 5 iterations and saves.
    let hops = [
        format!("{} {DIST}", layout(1, 1, 4)),
        format!("{} {DIST}", layout(1, 1, 2)),
        layout(1, 1, 1),
        format!("{} {DIST}", layout(2, 2, 2)),
    ];
    let mut prev: Option<String> = None;
    for (k, hop) in hops.iter().enumerate() {
        let ckpt = dir.path().join(format!("ckpt{k}"));
        let ckpt = ckpt.to_str().unwrap().to_string();
        let exit = 5 * (k + 1);
        let load = prev.as_ref().map(|p| format!("--load {p}")).unwrap_or_default();
        let run = pretrain(&flags(&format!("{hop} {load} --exit-interval {exit} --save {ckpt} --save-interval 5")))
            .unwrap_or_else(|e| panic!("hop {k} [{hop}]: {e:#}"));
        assert_eq!(run.final_iteration, exit as u64);
        let from = 5 * k;
        let diff = max_rel(&run.losses, &straight.losses[from..exit]);
        println!("hop {k} [{hop}] iterations {}..={exit}: max rel loss diff vs uninterrupted {diff:.2e}", from + 1);
        assert!(diff < 1e-5, "hop {k} [{hop}]: {diff:.2e}");
        prev = Some(ckpt);
    }
}

#[test]
fn overlap_param_gather_without_it_and_non_adam_are_refused() {
    let err = pretrain(&flags(&format!("{} --overlap-param-gather", layout(1, 1, 2)))).unwrap_err();
    assert!(format!("{err:#}").contains("add --use-distributed-optimizer"), "{err:#}");
    let err = pretrain(&flags(&format!("{} {DIST} --optimizer sgd", layout(1, 1, 2)))).unwrap_err();
    assert!(format!("{err:#}").contains("wraps Adam"), "{err:#}");
}

/// One rank's state size, parameters after 3 sharded steps and after a 4th in plain Adam.
type RankResult = (usize, Vec<Vec<f32>>, Vec<Vec<f32>>);

/// The optimizer on its own: with dp ranks (threads) each holding 1/dp of the state, three
/// steps give the same parameters as plain Adam on one rank (1e-6 relative; the fused Adam
/// kernel is elementwise), the per-rank state sums to 2·N fp32 values (the two moments,
/// N = 61, buckets padded to a multiple of dp), and the gathered per-parameter state
/// continues in plain Adam exactly like the uninterrupted plain run.
#[test]
fn sharded_adam_equals_plain_adam_and_holds_one_shard_of_state() {
    use megatron_core::{Backend, Group, HostBuffer, Optimizer, Param, ParamLayout};
    use megatron_optim::{Adam, AdamConfig, DistributedOptimizer, ShardedBucket};
    use std::sync::Arc;
    let bk: Arc<dyn Backend> = Arc::new(megatron_cpu::CpuBackend::new());
    let shapes: [(&str, Vec<usize>, bool); 3] =
        [("a", vec![7, 5], false), ("b", vec![14], true), ("c", vec![4, 3], false)];
    let make = |step: usize| -> Vec<Param> {
        shapes
            .iter()
            .enumerate()
            .map(|(i, (name, shape, no_wd))| {
                let n: usize = shape.iter().product();
                let v: Vec<f32> = (0..n).map(|j| ((i * 31 + j * 7) % 13) as f32 * 0.1 - 0.6).collect();
                let g: Vec<f32> = (0..n).map(|j| (((i + step) * 17 + j * 5) % 11) as f32 * 0.05 - 0.25).collect();
                Param {
                    name: name.to_string(),
                    value: bk.from_host(HostBuffer::F32(v), shape).unwrap(),
                    grad: bk.from_host(HostBuffer::F32(g), shape).unwrap(),
                    layout: ParamLayout::replicated(shape, *no_wd),
                }
            })
            .collect()
    };
    let set_grads = |ps: &mut [Param], step: usize| {
        for (p, fresh) in ps.iter_mut().zip(make(step)) {
            bk.copy(&fresh.grad, &mut p.grad).unwrap();
        }
    };
    let host = |t: &megatron_core::DeviceTensor| bk.to_host(t).unwrap().to_f32_vec();
    let cfg = AdamConfig::default();
    // Plain Adam, 4 steps.
    let mut plain = make(0);
    let mut adam = Adam::new(cfg).unwrap();
    let mut after3 = Vec::new();
    for step in 0..4 {
        set_grads(&mut plain, step);
        let mut refs: Vec<&mut Param> = plain.iter_mut().collect();
        adam.step(&mut refs, 1e-2, 0.1, bk.as_ref()).unwrap();
        if step == 2 {
            after3 = plain.iter().map(|p| host(&p.value)).collect();
        }
    }
    let want4: Vec<Vec<f32>> = plain.iter().map(|p| host(&p.value)).collect();
    for dp in [2usize, 4] {
        // The reducer's layout: reverse registration order, padded to a multiple of dp.
        let padded = 61usize.div_ceil(dp) * dp;
        let bucket = ShardedBucket {
            params: vec![("c".into(), 0, 12), ("b".into(), 12, 14), ("a".into(), 26, 35)],
            padded_numel: padded,
        };
        let comms = megatron_comm_local::LocalCommunicator::world(dp, std::time::Duration::from_secs(30));
        let results: Vec<RankResult> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|comm| {
                    let (comm, bucket, bk) = (comm.clone(), bucket.clone(), bk.clone());
                    s.spawn(move || {
                        let mut ps = make(0);
                        let group = Group::new("dp", (0..dp).collect());
                        let view: Vec<&Param> = ps.iter().collect();
                        let mut opt = DistributedOptimizer::new(cfg, vec![bucket], comm, group, &view).unwrap();
                        for step in 0..3 {
                            set_grads(&mut ps, step);
                            let mut refs: Vec<&mut Param> = ps.iter_mut().collect();
                            opt.step(&mut refs, 1e-2, 0.1, bk.as_ref()).unwrap();
                        }
                        let values3 = ps.iter().map(|p| host(&p.value)).collect();
                        // Save (collective), then continue in plain Adam from the saved state.
                        let state = opt.state(bk.as_ref()).unwrap();
                        let mut resumed = Adam::new(cfg).unwrap();
                        let view: Vec<&Param> = ps.iter().collect();
                        resumed.load_state(state, &view, bk.as_ref()).unwrap();
                        set_grads(&mut ps, 3);
                        let mut refs: Vec<&mut Param> = ps.iter_mut().collect();
                        resumed.step(&mut refs, 1e-2, 0.1, bk.as_ref()).unwrap();
                        (opt.state_numel(), values3, ps.iter().map(|p| host(&p.value)).collect())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let close = |a: &[Vec<f32>], b: &[Vec<f32>], what: &str| {
            for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
                assert!((x - y).abs() <= 1e-6 * y.abs().max(1.0), "dp{dp} {what}: {x} vs {y}");
            }
        };
        let total: usize = results.iter().map(|r| r.0).sum();
        assert_eq!(total, 2 * 61, "dp{dp}: the shards hold each parameter element once");
        for (numel, values3, values4) in &results {
            assert!(*numel <= 2 * padded / dp, "dp{dp}: a rank holds more than its shard: {numel}");
            close(values3, &after3, "after 3 sharded steps");
            close(values4, &want4, "4th step in plain Adam from the gathered state");
        }
    }
}
