//! Resuming from a checkpoint continues bit-identically (issue: 100 + save + resume to 200
//! equals 200 straight), `--finetune` resets iteration and optimizer.

mod common;
use common::*;

#[test]
fn resume_is_bit_identical_to_a_straight_run() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let straight = pretrain(&tiny_with("--train-iters 20")).unwrap();
    assert_eq!(straight.losses.len(), 20);

    let save = ckpt.to_str().unwrap();
    let first =
        pretrain(&tiny_with(&format!("--train-iters 20 --exit-interval 10 --save {save} --save-interval 10"))).unwrap();
    assert_eq!(first.final_iteration, 10);
    assert_eq!(std::fs::read_to_string(ckpt.join("latest_checkpointed_iteration.txt")).unwrap().trim(), "10");
    let second =
        pretrain(&tiny_with(&format!("--train-iters 20 --load {save} --save {save} --save-interval 10"))).unwrap();
    assert_eq!(second.losses.first().map(|l| l.0), Some(11), "resume must start at iteration 11");

    let resumed: Vec<(u64, f64)> = first.losses.iter().chain(second.losses.iter()).cloned().collect();
    assert_eq!(resumed.len(), straight.losses.len());
    for ((i, a), (j, b)) in straight.losses.iter().zip(&resumed) {
        assert_eq!(i, j);
        assert_eq!(a.to_bits(), b.to_bits(), "iteration {i}: straight {a} vs resumed {b}");
    }
    // Validation losses at the shared evaluation points agree too.
    assert_eq!(straight.valid_losses.first(), first.valid_losses.first());
}

#[test]
fn finetune_resets_iteration_and_optimizer() {
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().join("ckpt");
    let save = save.to_str().unwrap();
    pretrain(&tiny_with(&format!("--train-iters 6 --save {save} --save-interval 6"))).unwrap();
    let ft = pretrain(&tiny_with(&format!("--train-iters 5 --load {save} --finetune"))).unwrap();
    assert_eq!(ft.losses.first().map(|l| l.0), Some(1), "finetune restarts at iteration 1");
    let scratch = pretrain(&tiny_with("--train-iters 5")).unwrap();
    // Loaded weights are trained ones: the first loss differs from a fresh model's.
    assert_ne!(ft.losses[0].1, scratch.losses[0].1);
}

#[test]
fn load_with_other_model_shape_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().join("ckpt");
    let save = save.to_str().unwrap();
    pretrain(&tiny_with(&format!("--train-iters 4 --save {save} --save-interval 4"))).unwrap();
    let err = pretrain(&tiny_with(&format!("--hidden-size 64 --train-iters 4 --load {save}"))).unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("hidden"), "error should name the mismatched setting: {msg}");
}

/// Selective (core_attn) recomputation is what our attention always does, so the flags must not
/// change a single bit of the losses or gradient norms (dropout on: the masks are seed-derived).
#[test]
fn selective_recompute_is_bit_identical() {
    let plain = common::pretrain(&common::tiny_with("--train-iters 6")).unwrap();
    let recomputed = common::pretrain(&common::tiny_with(
        "--train-iters 6 --recompute-activations --recompute-granularity selective --recompute-modules core_attn",
    ))
    .unwrap();
    assert_eq!(plain.losses.len(), 6);
    let bits = |v: &[(u64, f64)]| v.iter().map(|(i, x)| (*i, x.to_bits())).collect::<Vec<_>>();
    assert_eq!(bits(&plain.losses), bits(&recomputed.losses));
    assert_eq!(bits(&plain.grad_norms), bits(&recomputed.grad_norms));
}
