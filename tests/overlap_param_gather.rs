//! `--overlap-param-gather` (SPEC §5.7): the distributed optimizer's step only starts the
//! per-bucket parameter all-gathers and each module's forward waits for its own bucket(s).
//! Same gathered values, so losses and gradient norms are **bitwise** those of the run without
//! overlap: 20 steps of the tiny GPT at dp2, dp4 and tp2·dp2 (small buckets, so a forward
//! finds some buckets still in flight), plus pp2·dp2, all within 1e-5 of one rank; and a
//! checkpoint round trip (saving waits for the gathers of the step just taken).

mod common;
use common::*;

fn flags(extra: &str) -> Vec<String> {
    tiny_with(&format!(
        "--vocab-size 128 --make-vocab-size-divisible-by 64 --hidden-dropout 0 --attention-dropout 0 \
         --global-batch-size 8 --train-iters 20 --eval-interval 10 --eval-iters 1 --log-interval 10 \
         --use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 1500 {extra}"
    ))
}

fn layout(tp: usize, pp: usize, dp: usize) -> String {
    format!("--nproc {} --tensor-model-parallel-size {tp} --pipeline-model-parallel-size {pp}", tp * pp * dp)
}

const OVERLAP: &str = "--overlap-param-gather";

#[test]
fn overlapped_param_gather_is_bit_identical_to_the_synchronous_one() {
    let single = pretrain(&tiny_with(
        "--vocab-size 128 --make-vocab-size-divisible-by 64 --hidden-dropout 0 --attention-dropout 0 \
         --global-batch-size 8 --train-iters 20 --eval-interval 10 --eval-iters 1 --log-interval 10",
    ))
    .unwrap();
    for (tp, pp, dp) in [(1, 1, 2), (1, 1, 4), (2, 1, 2), (1, 2, 2)] {
        let name = format!("tp{tp} pp{pp} dp{dp}");
        let sync = pretrain(&flags(&layout(tp, pp, dp))).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let over = pretrain(&flags(&format!("{} {OVERLAP}", layout(tp, pp, dp))))
            .unwrap_or_else(|e| panic!("{name} {OVERLAP}: {e:#}"));
        assert_eq!(over.losses.len(), 20);
        assert_eq!(over.losses, sync.losses, "{name}: losses differ with {OVERLAP}");
        assert_eq!(over.grad_norms, sync.grad_norms, "{name}: grad norms differ with {OVERLAP}");
        assert_eq!(over.valid_losses, sync.valid_losses, "{name}: validation losses differ with {OVERLAP}");
        let (loss, norm) = (max_rel(&over.losses, &single.losses), max_rel(&over.grad_norms, &single.grad_norms));
        println!(
            "{name}: 20 losses and grad norms bit-identical with and without {OVERLAP}; vs one rank: max rel diff \
             loss {loss:.2e}, grad norm {norm:.2e}"
        );
        assert!(loss < 1e-5 && norm < 1e-5, "{name}: vs one rank loss {loss:.2e}, norm {norm:.2e}");
    }
}

/// Interleaved 1F1B (2 model chunks per rank): every chunk gets the pre-hook, chunk 1's layers
/// wait for their buckets when the schedule first runs them.
#[test]
fn overlapped_param_gather_with_interleaving_is_bit_identical() {
    let layout = format!("{} --num-layers 4 --num-layers-per-virtual-pipeline-stage 1", layout(1, 2, 2));
    let sync = pretrain(&flags(&layout)).unwrap();
    let over = pretrain(&flags(&format!("{layout} {OVERLAP}"))).unwrap();
    assert_eq!(over.losses.len(), 20);
    assert_eq!(over.losses, sync.losses, "losses differ with {OVERLAP}");
    assert_eq!(over.grad_norms, sync.grad_norms, "grad norms differ with {OVERLAP}");
    println!("pp2·vp2·dp2: 20 losses and grad norms bit-identical with and without {OVERLAP}");
}

#[test]
fn overlapped_checkpoint_round_trip_matches_the_uninterrupted_run() {
    let straight = pretrain(&flags(&format!("{} {OVERLAP}", layout(1, 1, 2)))).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let ckpt = ckpt.to_str().unwrap();
    let first =
        pretrain(&flags(&format!("{} {OVERLAP} --exit-interval 10 --save {ckpt} --save-interval 10", layout(1, 1, 2))))
            .unwrap();
    assert_eq!(first.losses, straight.losses[..10]);
    // Resume without overlap at dp4: the saved parameters must be the updated ones.
    let second = pretrain(&flags(&format!("{} --load {ckpt}", layout(1, 1, 4)))).unwrap();
    let diff = max_rel(&second.losses, &straight.losses[10..]);
    println!("dp2 {OVERLAP} save at 10 -> dp4 without it: next 10 losses max rel diff {diff:.2e}");
    assert!(diff < 1e-5, "{diff:.2e}");
}

#[test]
fn overlap_param_gather_needs_the_distributed_optimizer_in_fp32() {
    let plain = tiny_with(&format!("{} {OVERLAP} --train-iters 2", layout(1, 1, 2)));
    let err = pretrain(&plain).unwrap_err();
    assert!(format!("{err:#}").contains("add --use-distributed-optimizer"), "{err:#}");
    let err = pretrain(&flags(&format!("{} {OVERLAP} --bf16", layout(1, 1, 2)))).unwrap_err();
    assert!(format!("{err:#}").contains("fp32 only"), "{err:#}");
}
