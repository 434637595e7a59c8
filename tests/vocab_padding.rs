//! Issue 13: padded vocabulary rows do not change what is learned. The GPT-2 vocabulary
//! (50257) is padded to 50304 at tp = 1 and 50432 at tp = 2 (Megatron's default
//! `--make-vocab-size-divisible-by 128`); the padded logits are masked out of the softmax, so
//! 12 training steps give the same losses (1e-5 relative; before the mask they differed by
//! ~2.5e-4).

mod common;
use common::*;

#[test]
fn gpt2_vocab_losses_do_not_depend_on_the_tp_padding() {
    let run = |extra: &str| {
        pretrain(&tiny_with(&format!(
            "--vocab-size 50257 --make-vocab-size-divisible-by 128 --hidden-dropout 0 --attention-dropout 0 \
             --global-batch-size 4 --train-iters 12 --eval-interval 12 --eval-iters 1 --log-interval 1 {extra}"
        )))
        .unwrap_or_else(|e| panic!("[{extra}]: {e:#}"))
    };
    let tp1 = run("");
    let tp2 = run("--nproc 2 --tensor-model-parallel-size 2");
    assert_eq!(tp1.losses.len(), 12);
    let worst = tp1.losses.iter().zip(&tp2.losses).map(|((_, a), (_, b))| (a - b).abs() / a.abs()).fold(0.0, f64::max);
    println!("GPT-2 vocab, tp1 (50304) vs tp2 (50432): max relative loss difference over 12 steps {worst:.2e}");
    assert!(worst < 1e-5, "tp1 vs tp2 losses differ by {worst:.2e}");
}
