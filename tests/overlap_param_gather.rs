//! `--overlap-param-gather` (SPEC §5.7): the distributed optimizer's step only starts the
//! per-bucket parameter all-gathers and each module's forward waits for its own bucket(s).
//! Same gathered values, so losses and gradient norms are **bitwise** those of the run without
//! overlap: 20 steps of the tiny GPT at dp2, dp4 and tp2·dp2 (small buckets, so a forward
//! finds some buckets still in flight), plus pp2·dp2, all within 1e-5 of one rank; and a
//! checkpoint round trip (saving waits for the gathers of the step just taken).
//!
//! `--bf16` / `--fp16`: the distributed optimizer keeps the fp32 main values of its shard and
//! gathers the half values rounded on their owner; losses, grad norms, validation losses and the loss scale of every iteration are
//! bitwise those without overlap at dp2, tp2·dp2 and pp2·dp2, with steps skipped on the way
//! (fp16: a live scaler and a forced overflow; bf16: a NaN gradient skipped by the guard); a
//! half checkpoint saved with gathers pending resumes bit-identically, also through a rewind.

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
    assert_eq!(bits(&first.losses), bits(&straight.losses[..10]));
    // Resume without overlap at dp4: the saved parameters must be the updated ones.
    let second = pretrain(&flags(&format!("{} --load {ckpt}", layout(1, 1, 4)))).unwrap();
    let diff = max_rel(&second.losses, &straight.losses[10..]);
    println!("dp2 {OVERLAP} save at 10 -> dp4 without it: next 10 losses max rel diff {diff:.2e}");
    assert!(diff < 1e-5, "{diff:.2e}");
}

#[test]
fn overlap_param_gather_needs_the_distributed_optimizer() {
    let plain = tiny_with(&format!("{} {OVERLAP} --train-iters 2", layout(1, 1, 2)));
    let err = pretrain(&plain).unwrap_err();
    assert!(format!("{err:#}").contains("add --use-distributed-optimizer"), "{err:#}");
}

/// [`flags`] without `--overlap-grad-reduce`: the NaN of `--inject-nan-grad` goes into the
/// gradients after the backward, when an overlapped reduction would already have taken them.
fn half_flags(extra: &str) -> Vec<String> {
    flags(extra).into_iter().filter(|f| f != "--overlap-grad-reduce").collect()
}

/// A run with the loss scale of every iteration (from `--metrics-jsonl`).
struct Run {
    summary: megatron::train::TrainSummary,
    scales: Vec<(u64, f64)>,
}

fn run(args: Vec<String>) -> Run {
    let (summary, scales) = pretrain_with_loss_scales(args);
    Run { summary, scales }
}

fn assert_bit_identical(over: &Run, sync: &Run, name: &str) {
    assert_eq!(over.summary.losses.len(), 20, "{name}");
    assert_eq!(bits(&over.summary.losses), bits(&sync.summary.losses), "{name}: losses differ with {OVERLAP}");
    assert_eq!(
        bits(&over.summary.grad_norms),
        bits(&sync.summary.grad_norms),
        "{name}: grad norms differ with {OVERLAP}"
    );
    assert_eq!(bits(&over.summary.valid_losses), bits(&sync.summary.valid_losses), "{name}: validation losses differ");
    assert_eq!(over.scales.len(), 20, "{name}: one loss scale per iteration");
    assert_eq!(over.scales, sync.scales, "{name}: loss scales differ with {OVERLAP}");
}

fn skipped(r: &Run) -> Vec<u64> {
    r.summary.grad_norms.iter().filter(|(_, n)| *n == 0.0 || n.is_nan()).map(|(i, _)| *i).collect()
}

#[test]
fn overlapped_param_gather_in_bf16_and_fp16_is_bit_identical() {
    for precision in ["bf16", "fp16"] {
        let h = half_with_a_skipped_step(precision);
        let single = run(tiny_with(&format!(
            "--vocab-size 128 --make-vocab-size-divisible-by 64 --hidden-dropout 0 --attention-dropout 0 \
             --global-batch-size 8 --train-iters 20 --eval-interval 10 --eval-iters 1 --log-interval 10 {h}"
        )));
        for (tp, pp, dp) in [(1, 1, 2), (2, 1, 2), (1, 2, 2)] {
            let name = format!("{precision} tp{tp} pp{pp} dp{dp}");
            let sync = run(half_flags(&format!("{} {h}", layout(tp, pp, dp))));
            let over = run(half_flags(&format!("{} {h} {OVERLAP}", layout(tp, pp, dp))));
            assert_bit_identical(&over, &sync, &name);
            let skips = skipped(&over);
            let forced = if precision == "bf16" { 12 } else { 7 };
            assert!(skips.contains(&forced), "{name}: iteration {forced} must be skipped, skipped {skips:?}");
            assert_eq!(skips, skipped(&single), "{name}: the single-rank run skips other iterations");
            let (loss, norm) = (
                max_rel(&over.summary.losses, &single.summary.losses),
                max_rel(&over.summary.grad_norms, &single.summary.grad_norms),
            );
            println!(
                "{name}: 20 losses, grad norms, validation losses and loss scales bit-identical with and without \
                 {OVERLAP} (skipped iterations {skips:?}, loss scales {:?}..{:?}); vs one rank: max rel diff loss \
                 {loss:.2e}, grad norm {norm:.2e}",
                over.scales[0].1, over.scales[19].1
            );
            assert_eq!(over.scales, single.scales, "{name}: the loss scale follows the single-rank run's");
            // Half precision: the reduction order moves a rounding now and then (see
            // tests/mixed_precision.rs); fp32 runs are held to 1e-5 above.
            assert!(loss < 1e-2 && norm < 5e-2, "{name}: vs one rank loss {loss:.2e}, norm {norm:.2e}");
        }
    }
}

/// Half checkpoints with gathers pending: the save at 10 waits for the pending gathers (the
/// main values are the optimizer's own shards); resuming (with or without overlap) continues
/// bit-identically. A bf16 rewind (`--on-nan rewind` at the NaN of iteration 12) loads
/// iteration 10 while gathers are pending.
#[test]
fn overlapped_half_checkpoints_and_rewinds_are_bit_identical() {
    let lay = layout(1, 1, 2);
    let dir = tempfile::tempdir().unwrap();
    for precision in ["bf16", "fp16"] {
        let h = half_with_a_skipped_step(precision);
        let straight = pretrain(&half_flags(&format!("{lay} {h} {OVERLAP}"))).unwrap();
        let ckpt = dir.path().join(precision);
        let ckpt = ckpt.to_str().unwrap();
        let first =
            pretrain(&half_flags(&format!("{lay} {h} {OVERLAP} --exit-interval 10 --save {ckpt} --save-interval 10")))
                .unwrap();
        assert_eq!(bits(&first.losses), bits(&straight.losses[..10]));
        for resume in ["", OVERLAP] {
            let second = pretrain(&half_flags(&format!("{lay} {h} {resume} --load {ckpt}"))).unwrap();
            assert_eq!(bits(&second.losses), bits(&straight.losses[10..]), "{precision}: resumed with `{resume}`");
            assert_eq!(
                bits(&second.grad_norms),
                bits(&straight.grad_norms[10..]),
                "{precision}: resumed with `{resume}`"
            );
        }
        println!("{precision}: save at 10 with gathers pending -> resume with and without {OVERLAP}: next 10 losses and grad norms bit-identical");
    }
    let rewind = |name: &str, extra: &str| {
        let save = dir.path().join(name);
        let f = format!(
            "{lay} {} --on-nan rewind --save {} --save-interval 5 {extra}",
            half_with_a_skipped_step("bf16"),
            save.display()
        );
        pretrain(&half_flags(&f)).unwrap()
    };
    let (sync, over) = (rewind("rewind-sync", ""), rewind("rewind-overlap", OVERLAP));
    assert_eq!(over.rewinds.len(), 1, "bf16: the NaN of iteration 12 must rewind once");
    assert_eq!(bits(&over.losses), bits(&sync.losses), "bf16 rewind: losses differ with {OVERLAP}");
    assert_eq!(bits(&over.grad_norms), bits(&sync.grad_norms), "bf16 rewind: grad norms differ with {OVERLAP}");
    println!("bf16 --on-nan rewind (loads iteration 10 with gathers pending): losses and grad norms bit-identical with and without {OVERLAP}");
}
