//! Multi-rank training (`--nproc`, ranks as threads) matches the single-rank run: the tiny GPT
//! for 20 steps (fp32, dropout off, same global batch) under every (tp, pp, dp) layout gives
//! per-iteration losses and gradient norms within 1e-5 relative of tp = pp = dp = 1;
//! `--overlap-grad-reduce` gives bitwise the same run; a checkpoint saved under one layout
//! resumes under another (tp2·dp2 ⇄ tp1·dp1, pp2 → tp2) on the uninterrupted trajectory; an
//! uneven pipeline split (`--decoder-first-pipeline-num-layers`) matches too.

mod common;
use common::*;

/// Tiny GPT, no dropout, 20 iterations, global batch 8 (mbs 2). Vocab 128 padded to a multiple
/// of 64·tp stays 128 for tp <= 2, so every layout trains the same model.
fn parity_flags(extra: &str) -> Vec<String> {
    tiny_with(&format!(
        "--vocab-size 128 --make-vocab-size-divisible-by 64 --hidden-dropout 0 --attention-dropout 0 \
         --global-batch-size 8 --train-iters 20 --eval-interval 20 --eval-iters 1 --log-interval 10 {extra}"
    ))
}

fn layout(tp: usize, pp: usize, dp: usize) -> String {
    format!("--nproc {} --tensor-model-parallel-size {tp} --pipeline-model-parallel-size {pp}", tp * pp * dp)
}

/// Largest relative difference between two per-iteration series (same iterations).
#[test]
fn every_layout_matches_the_single_rank_run() {
    let reference = pretrain(&parity_flags("")).unwrap();
    assert_eq!(reference.losses.len(), 20);
    for (tp, pp, dp) in [(2, 1, 1), (1, 1, 2), (2, 1, 2), (1, 2, 1), (1, 2, 2), (2, 2, 1), (2, 2, 2)] {
        let run = pretrain(&parity_flags(&layout(tp, pp, dp)))
            .unwrap_or_else(|e| panic!("tp{tp} pp{pp} dp{dp} failed: {e:#}"));
        let (loss, norm) = (max_rel(&run.losses, &reference.losses), max_rel(&run.grad_norms, &reference.grad_norms));
        println!("tp{tp} pp{pp} dp{dp}: max relative diff loss {loss:.2e}, grad norm {norm:.2e}");
        assert!(loss < 1e-5 && norm < 1e-5, "tp{tp} pp{pp} dp{dp}: loss {loss:.2e}, grad norm {norm:.2e}");
        assert_eq!(run.valid_losses.len(), reference.valid_losses.len());
    }
}

#[test]
fn overlapped_grad_reduce_equals_no_overlap_bitwise() {
    let plain = pretrain(&parity_flags(&layout(2, 1, 2))).unwrap();
    // Small buckets, so several all-reduces overlap with backward.
    let overlap =
        pretrain(&parity_flags(&format!("{} --overlap-grad-reduce --ddp-bucket-size 2000", layout(2, 1, 2)))).unwrap();
    for (a, b) in [(&plain.losses, &overlap.losses), (&plain.grad_norms, &overlap.grad_norms)] {
        assert_eq!(a.len(), 20);
        for ((i, x), (_, y)) in a.iter().zip(b.iter()) {
            assert_eq!(x.to_bits(), y.to_bits(), "iteration {i}: no overlap {x} vs overlap {y}");
        }
    }
}

#[test]
fn checkpoints_reshard_between_layouts() {
    let straight = pretrain(&parity_flags("")).unwrap();
    for (save_layout, load_layout) in [
        (layout(2, 2, 2), layout(1, 1, 1)),
        (layout(1, 1, 1), layout(2, 2, 2)),
        (layout(2, 1, 2), layout(1, 1, 1)),
        (layout(1, 2, 1), layout(2, 1, 1)),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let ckpt = dir.path().join("ckpt");
        let ckpt = ckpt.to_str().unwrap();
        let first =
            pretrain(&parity_flags(&format!("{save_layout} --exit-interval 10 --save {ckpt} --save-interval 10")))
                .unwrap();
        assert_eq!(first.final_iteration, 10);
        let second = pretrain(&parity_flags(&format!("{load_layout} --load {ckpt}"))).unwrap();
        assert_eq!(second.losses.first().map(|l| l.0), Some(11), "resume starts at iteration 11");
        let diff = max_rel(&second.losses, &straight.losses[10..]);
        println!("save [{save_layout}] -> load [{load_layout}]: max relative loss diff {diff:.2e}");
        assert!(diff < 1e-5, "save [{save_layout}] -> load [{load_layout}]: {diff:.2e}");
    }
}

/// `--decoder-first-pipeline-num-layers`: pp = 2 as 3 + 1 of 4 layers trains the same model
/// (global layer numbering) as one rank; impossible splits are errors naming the flag.
#[test]
fn uneven_pipeline_split_matches_the_single_rank_run() {
    let reference = pretrain(&parity_flags("--num-layers 4")).unwrap();
    let uneven = format!("{} --num-layers 4 --decoder-first-pipeline-num-layers 3", layout(1, 2, 1));
    let run = pretrain(&parity_flags(&uneven)).unwrap();
    let (loss, norm) = (max_rel(&run.losses, &reference.losses), max_rel(&run.grad_norms, &reference.grad_norms));
    println!("pp2 first=3 of 4: max relative diff loss {loss:.2e}, grad norm {norm:.2e}");
    assert!(loss < 1e-5 && norm < 1e-5, "pp2 first=3: loss {loss:.2e}, grad norm {norm:.2e}");
    let bad = format!("{} --num-layers 4 --decoder-first-pipeline-num-layers 4", layout(1, 2, 1));
    let err = format!("{:#}", pretrain(&parity_flags(&bad)).unwrap_err());
    assert!(err.contains("--decoder-first-pipeline-num-layers 4"), "{err}");
    let err = pretrain(&parity_flags("--decoder-last-pipeline-num-layers 1")).unwrap_err().to_string();
    assert!(err.contains("--pipeline-model-parallel-size >= 2"), "{err}");
}

#[test]
fn layout_errors_name_the_flags() {
    let err = pretrain(&parity_flags("--nproc 3 --tensor-model-parallel-size 2")).unwrap_err().to_string();
    assert!(err.contains("--nproc 3") && err.contains("--tensor-model-parallel-size 2"), "{err}");
}

#[test]
fn a_failing_rank_is_named_and_stops_the_others() {
    // One attention head cannot be split over tp = 2: every rank fails while building its model.
    let err = pretrain(&parity_flags("--nproc 2 --tensor-model-parallel-size 2 --num-attention-heads 1"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("of 2 failed") && err.contains("--tensor-model-parallel-size 2"), "{err}");
}
