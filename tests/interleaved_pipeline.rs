//! The interleaved 1F1B schedule (SPEC §5.5) through `megatron pretrain`: a tiny 8-layer GPT
//! for 20 steps (fp32, dropout off) at pp2 and pp4 with 2 model chunks per rank, at pp2 with an
//! uneven first stage, and at 8 ranks
//! with everything combined (tp2·pp2·dp2, sequence parallelism, interleaving, the distributed
//! optimizer with overlapped reduce-scatters), matches the single-rank run (losses and grad
//! norms within 1e-5 relative); checkpoints saved with interleaving resume without it and
//! the other way round; Megatron's rules on the flags and the microbatch count are errors.

mod common;
use common::*;

/// Tiny GPT with 8 layers (divisible by pp 4 x 2 chunks), no dropout, 20 iterations, global
/// batch 8 in microbatches of 2.
fn vp_flags(extra: &str) -> Vec<String> {
    tiny_with(&format!(
        "--num-layers 8 --vocab-size 128 --make-vocab-size-divisible-by 64 --hidden-dropout 0 \
         --attention-dropout 0 --global-batch-size 8 --train-iters 20 --eval-interval 20 --eval-iters 1 \
         --log-interval 10 {extra}"
    ))
}

#[test]
fn interleaved_pipeline_matches_the_single_rank_run() {
    let reference = pretrain(&vp_flags("")).unwrap();
    assert_eq!(reference.losses.len(), 20);
    let cases = [
        // pp2: 4 layers per rank, 2 per chunk.
        "--nproc 2 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2",
        // pp4: 2 chunks of 1 layer per rank.
        "--nproc 4 --pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2",
        // Uneven: rank 0 holds 2 layers (1 per chunk), rank 1 six (3 per chunk).
        "--nproc 2 --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 \
         --decoder-first-pipeline-num-layers 2",
        // Everything at once: tp2·pp2·dp2 with SP, 2 chunks, the distributed optimizer and
        // overlapped reduce-scatters in small buckets (2 microbatches per rank).
        "--nproc 8 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel \
         --num-virtual-stages-per-pipeline-rank 2 --use-distributed-optimizer --overlap-grad-reduce \
         --ddp-bucket-size 1500",
    ];
    for case in cases {
        let run = pretrain(&vp_flags(case)).unwrap_or_else(|e| panic!("[{case}]: {e:#}"));
        let (loss, norm) = (max_rel(&run.losses, &reference.losses), max_rel(&run.grad_norms, &reference.grad_norms));
        println!("interleaved [{case}]: max rel diff loss {loss:.2e}, grad norm {norm:.2e}");
        assert!(loss < 1e-5 && norm < 1e-5, "[{case}]: loss {loss:.2e}, grad norm {norm:.2e}");
    }
}

/// Checkpoints hold parameters (and optimizer state) by global name, so a run saved with
/// model chunks resumes at pp = 1 and a pp = 1 checkpoint resumes interleaved, both on the
/// uninterrupted trajectory.
#[test]
fn interleaved_checkpoints_resume_across_layouts() {
    let straight = pretrain(&vp_flags("")).unwrap();
    let vp = "--nproc 4 --pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2".to_string();
    let plain = "--nproc 1".to_string();
    for (save, load) in [(vp.clone(), plain.clone()), (plain, vp.clone()), (vp.clone(), vp)] {
        let dir = tempfile::tempdir().unwrap();
        let ckpt = dir.path().join("ckpt");
        let ckpt = ckpt.to_str().unwrap();
        pretrain(&vp_flags(&format!("{save} --exit-interval 10 --save {ckpt} --save-interval 10"))).unwrap();
        let second = pretrain(&vp_flags(&format!("{load} --load {ckpt}"))).unwrap();
        assert_eq!(second.losses.first().map(|l| l.0), Some(11), "resume starts at iteration 11");
        let diff = max_rel(&second.losses, &straight.losses[10..]);
        println!("save [{save}] -> load [{load}]: max relative loss diff {diff:.2e}");
        assert!(diff < 1e-5, "save [{save}] -> load [{load}]: {diff:.2e}");
    }
}

#[test]
fn interleaving_rules_are_errors_that_state_them() {
    let refused = |extra: &str| match pretrain(&vp_flags(extra)) {
        Ok(_) => panic!("[{extra}] must be refused"),
        Err(e) => format!("{e:#}"),
    };
    let pp2 = "--nproc 2 --pipeline-model-parallel-size 2";
    // 8 layers / pp 2 = 4 per stage, not divisible by 3.
    let e = refused(&format!("{pp2} --num-layers-per-virtual-pipeline-stage 3"));
    assert!(e.contains("divisible by --num-layers-per-virtual-pipeline-stage 3"), "{e}");
    let e =
        refused(&format!("{pp2} --num-layers-per-virtual-pipeline-stage 2 --num-virtual-stages-per-pipeline-rank 2"));
    assert!(e.contains("at most one"), "{e}");
    let e = refused("--num-virtual-stages-per-pipeline-rank 2");
    assert!(e.contains("--pipeline-model-parallel-size >= 2"), "{e}");
    // 8 layers over pp 2 x 3 chunks.
    let e = refused(&format!("{pp2} --num-virtual-stages-per-pipeline-rank 3"));
    assert!(e.contains("--num-layers 8 must be divisible"), "{e}");
    // 8 / 2 = 4 microbatches at pp 4: fine; global batch 6 gives 3 < pp microbatches.
    let e = refused(
        "--nproc 4 --pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2 --global-batch-size 6",
    );
    assert!(e.contains("pp <= N") && e.contains("3 microbatches"), "{e}");
    // 5 microbatches in groups of 2 leave 1 < pp.
    let e = refused(&format!("{pp2} --num-virtual-stages-per-pipeline-rank 2 --global-batch-size 10"));
    assert!(e.contains("last group of 1 < pp = 2"), "{e}");
    // Uneven stages: 3 layers on the first stage do not split over 2 chunks.
    let e = refused(&format!("{pp2} --num-virtual-stages-per-pipeline-rank 2 --decoder-first-pipeline-num-layers 3"));
    assert!(e.contains("--decoder-first-pipeline-num-layers 3 must be divisible by the 2 model chunks"), "{e}");
}
