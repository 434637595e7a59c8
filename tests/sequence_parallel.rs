//! `--sequence-parallel` (SPEC §5.3) through `megatron pretrain`: the tiny GPT for 20 steps
//! (fp32, dropout off) at tp2 and tp2·pp2 with sequence parallelism matches the single-rank
//! run (losses and grad norms within 1e-5 relative), also with overlapped DDP at tp2·dp2 and
//! combined with pipelining, data parallelism and the distributed optimizer at 8 ranks; with dropout on, a sequence-parallel run is
//! bit-identical when repeated; checkpoints move between SP and non-SP layouts; the flag is
//! refused at tp = 1.

mod common;
use common::*;

/// Tiny GPT, no dropout, 20 iterations, global batch 8 (vocab 128 stays unpadded up to tp 2).
fn sp_flags(extra: &str) -> Vec<String> {
    tiny_with(&format!(
        "--vocab-size 128 --make-vocab-size-divisible-by 64 --hidden-dropout 0 --attention-dropout 0 \
         --global-batch-size 8 --train-iters 20 --eval-interval 20 --eval-iters 1 --log-interval 10 {extra}"
    ))
}

fn layout(tp: usize, pp: usize, dp: usize) -> String {
    format!("--nproc {} --tensor-model-parallel-size {tp} --pipeline-model-parallel-size {pp}", tp * pp * dp)
}

#[test]
fn sequence_parallel_matches_the_single_rank_run() {
    let reference = pretrain(&sp_flags("")).unwrap();
    assert_eq!(reference.losses.len(), 20);
    let cases = [
        layout(2, 1, 1),
        layout(2, 2, 1),
        format!("{} --overlap-grad-reduce --ddp-bucket-size 1500", layout(2, 1, 2)),
        // Everything at once: 8 ranks, SP, DP with the distributed optimizer and overlapped
        // reduce-scatters in small buckets.
        format!("{} --use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 1500", layout(2, 2, 2)),
    ];
    for case in cases {
        let run = pretrain(&sp_flags(&format!("{case} --sequence-parallel")))
            .unwrap_or_else(|e| panic!("[{case}] --sequence-parallel: {e:#}"));
        let (loss, norm) = (max_rel(&run.losses, &reference.losses), max_rel(&run.grad_norms, &reference.grad_norms));
        println!("SP [{case}]: max rel diff loss {loss:.2e}, grad norm {norm:.2e}");
        assert!(loss < 1e-5 && norm < 1e-5, "[{case}] --sequence-parallel: loss {loss:.2e}, grad norm {norm:.2e}");
    }
}

/// Dropout masks on the token shards come from each TP rank's stream (SPEC §5.11), so an SP
/// run with dropout differs from the non-SP one, but never from itself.
#[test]
fn sequence_parallel_with_dropout_is_deterministic() {
    let flags =
        tiny_with(&format!("--train-iters 6 --eval-interval 6 --eval-iters 1 {} --sequence-parallel", layout(2, 1, 1)));
    let a = pretrain(&flags).unwrap();
    let b = pretrain(&flags).unwrap();
    assert_eq!(a.losses, b.losses);
    assert_eq!(a.grad_norms, b.grad_norms);
    assert!(a.losses.iter().all(|(_, l)| l.is_finite()));
}

#[test]
fn sequence_parallel_needs_tensor_parallelism() {
    let refused = |extra: &str| match pretrain(&sp_flags(extra)) {
        Ok(_) => panic!("[{extra}] must be refused"),
        Err(e) => e.to_string(),
    };
    let err = refused("--sequence-parallel");
    assert!(err.contains("--sequence-parallel") && err.contains("--tensor-model-parallel-size"), "{err}");
    let err = refused(&format!("{} --seq-length 15 --sequence-parallel", layout(2, 1, 1)));
    assert!(err.contains("divisible"), "{err}");
}

/// A checkpoint saved with sequence parallelism resumes without it (and the other way round)
/// on the uninterrupted trajectory: SP changes no parameter or its layout.
#[test]
fn checkpoints_move_between_sequence_parallel_and_plain_layouts() {
    let straight = pretrain(&sp_flags("")).unwrap();
    let sp = format!("{} --sequence-parallel", layout(2, 2, 1));
    for (save, load) in [(sp.clone(), layout(1, 1, 1)), (layout(1, 1, 1), sp.clone())] {
        let dir = tempfile::tempdir().unwrap();
        let ckpt = dir.path().join("ckpt");
        let ckpt = ckpt.to_str().unwrap();
        pretrain(&sp_flags(&format!("{save} --exit-interval 10 --save {ckpt} --save-interval 10"))).unwrap();
        let second = pretrain(&sp_flags(&format!("{load} --load {ckpt}"))).unwrap();
        assert_eq!(second.losses.first().map(|l| l.0), Some(11), "resume starts at iteration 11");
        let diff = max_rel(&second.losses, &straight.losses[10..]);
        println!("save [{save}] -> load [{load}]: max relative loss diff {diff:.2e}");
        assert!(diff < 1e-5, "save [{save}] -> load [{load}]: {diff:.2e}");
    }
}
