//! Training guards, spike and rewind end to end (issue 19): a crafted global batch — a
//! document of random tokens in a corpus of a repeated cycle — makes the loss jump once the
//! model has learned the cycle. `--spike-threshold … --on-spike rewind` catches it, goes back to
//! the last checkpoint, puts the batch's samples on the skip list and records the list in that
//! checkpoint; the replay matches the unguarded run bit for bit up to the batch and never
//! trains on it, and a run resumed from the checkpoint the rewind went back to skips it too.
//! `--on-nan rewind` does the same for the NaN of `--inject-nan-grad`. With a window of 10
//! the trend score catches the first spike during the steep descent (the mean/std score
//! misses it).

mod common;

use common::*;
use megatron_datasets::{IndexedDatasetBuilder, TokenDType};
use std::path::Path;

/// 60 documents of the cycle `1 2 3 4` (learned within a few iterations) and one poisoned
/// document of random tokens in 50..98 (NullTokenizer of 100 ids: 100 is its end-of-document
/// id); about two epochs in 40 iterations, so the poison comes by twice.
fn write_corpus(prefix: &Path) -> anyhow::Result<()> {
    let mut w = IndexedDatasetBuilder::create(prefix, TokenDType::U16)?;
    let mut lcg = 12345u64;
    for d in 0..61usize {
        let doc: Vec<u16> = if d == 30 {
            (0..32)
                .map(|_| {
                    lcg = lcg.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (50 + (lcg >> 33) % 48) as u16
                })
                .collect()
        } else {
            (0..24).map(|p| (p % 4 + 1) as u16).collect()
        };
        w.add_item(&doc)?;
        w.end_document();
    }
    w.finalize()
}

fn run_flags(data: &str, extra: &str) -> Vec<String> {
    let mut f: Vec<String> = tiny_with(&format!(
        "--train-iters 40 --hidden-dropout 0 --attention-dropout 0 --eval-iters 0 --lr-warmup-iters 2 --lr 1e-2 {extra}"
    ))
    .into_iter()
    .filter(|f| f != "--mock-data")
    .collect();
    f.extend(flags(&format!("--tokenizer-type NullTokenizer --data-path {data} --split 100,0,0")));
    f
}

fn loss_at(losses: &[(u64, f64)], it: u64) -> f64 {
    losses.iter().rev().find(|(i, _)| *i == it).map_or(f64::NAN, |(_, l)| *l)
}

#[test]
fn a_crafted_spike_is_rewound_and_never_seen_again() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("counting_text_document");
    write_corpus(&prefix).unwrap();
    let data = prefix.to_str().unwrap();
    let ckpt = dir.path().join("ckpt");
    let save = ckpt.to_str().unwrap();

    let plain = pretrain(&run_flags(data, "")).unwrap();
    let guard = format!("--spike-threshold 5 --spike-window 6 --on-spike rewind --save {save} --save-interval 4");
    let guarded = pretrain(&run_flags(data, &guard)).unwrap();
    eprintln!("plain losses {:?}", plain.losses);
    eprintln!("rewinds {:?} skipped {:?}", guarded.rewinds, guarded.skipped_batches);

    assert!(!guarded.rewinds.is_empty(), "no spike caught: {:?}", plain.losses);
    let first = &guarded.rewinds[0];
    let k = first.iteration;
    assert_eq!(first.back_to, (k - 1) / 4 * 4, "back to the last checkpoint before iteration {k}");
    assert_eq!(first.samples, (k - 1) * 4..k * 4, "the spiking iteration's global batch");
    // The unguarded run shows each spike there: the loss jumps to several times the last one.
    for r in &guarded.rewinds {
        let (i, l) = (r.iteration, loss_at(&plain.losses, r.iteration));
        assert!(l > 2.0 * loss_at(&plain.losses, i - 1), "iteration {i}: {:?}", plain.losses);
    }
    // The replay is the same run up to the batch, which is then consumed without training.
    for i in 1..k {
        assert_eq!(loss_at(&plain.losses, i).to_bits(), loss_at(&guarded.losses, i).to_bits(), "iteration {i}");
    }
    let rewound: Vec<u64> = guarded.rewinds.iter().map(|r| r.iteration).collect();
    assert_eq!(guarded.skipped_batches, rewound, "every rewound batch is skipped once, nothing else");
    assert_eq!(guarded.final_iteration, 40);

    // The checkpoint the (last) rewind went back to records the skip list: a run resumed from
    // it — no spike detector this time — skips the batch and continues exactly as the guarded
    // run did.
    let last = guarded.rewinds.last().unwrap();
    std::fs::write(ckpt.join("latest_checkpointed_iteration.txt"), last.back_to.to_string()).unwrap();
    let resumed = pretrain(&run_flags(data, &format!("--load {save}"))).unwrap();
    assert!(resumed.rewinds.is_empty());
    let ahead: Vec<u64> = rewound.iter().copied().filter(|&i| i > last.back_to).collect();
    assert_eq!(resumed.skipped_batches, ahead);
    assert!(resumed.losses.first().is_some_and(|l| l.0 > last.back_to), "resumed from {}", last.back_to);
    for (i, l) in &resumed.losses {
        assert_eq!(l.to_bits(), loss_at(&guarded.losses, *i).to_bits(), "iteration {i}");
    }
}

/// With a window of 10 the first crafted spike comes while the loss still falls steeply: the
/// default trend score (robust line through the window) catches it, the plain mean/std score
/// (`--spike-score mean`) takes the descent for noise and misses it (it catches the later one).
#[test]
fn window_10_catches_the_spike_during_the_descent() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("counting_text_document");
    write_corpus(&prefix).unwrap();
    let data = prefix.to_str().unwrap();
    let plain = pretrain(&run_flags(data, "")).unwrap();
    // The first iteration whose loss more than doubles: the poisoned batch.
    let first = (2..=40u64).find(|&i| loss_at(&plain.losses, i) > 2.0 * loss_at(&plain.losses, i - 1)).unwrap();
    let guarded = |score: &str, name: &str| {
        let save = dir.path().join(name);
        let flags = format!(
            "--spike-threshold 5 --spike-window 10 --spike-score {score} --on-spike rewind --save {} --save-interval 4",
            save.display()
        );
        pretrain(&run_flags(data, &flags)).unwrap()
    };
    let trend = guarded("trend", "trend");
    let caught: Vec<u64> = trend.rewinds.iter().map(|r| r.iteration).collect();
    eprintln!("first spike at {first}; trend score rewound {caught:?}");
    assert_eq!(caught.first(), Some(&first), "trend score at window 10: {:?}", plain.losses);
    let mean = guarded("mean", "mean");
    let caught_mean: Vec<u64> = mean.rewinds.iter().map(|r| r.iteration).collect();
    eprintln!("mean score rewound {caught_mean:?}");
    assert!(!caught_mean.contains(&first), "the plain score was expected to miss iteration {first}");
}

#[test]
fn nan_rewind_goes_back_and_skips_the_batch() {
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().join("ckpt");
    let save = save.to_str().unwrap();
    let param = "decoder.layers.1.mlp.linear_fc2.weight";
    let run = |extra: &str| {
        pretrain(&tiny_with(&format!("--train-iters 6 --eval-iters 0 --save {save} --save-interval 2 {extra}")))
    };
    let no_checkpoint = pretrain(&tiny_with(&format!(
        "--train-iters 3 --lr-warmup-iters 1 --on-nan rewind --inject-nan-grad 1:0:{param}"
    )));
    let err = format!("{:#}", no_checkpoint.unwrap_err());
    assert!(err.contains("rewind needs a checkpoint") && err.contains("iteration 1"), "{err}");

    let s = run(&format!("--on-nan rewind --inject-nan-grad 3:1:{param}")).unwrap();
    let r = &s.rewinds[..];
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!((r[0].iteration, r[0].back_to, r[0].samples.clone()), (3, 2, 8..12));
    assert_eq!(s.skipped_batches, vec![3]);
    assert_eq!(s.final_iteration, 6);
    // Every kept iteration trained: finite, and iteration 3 appears only as the bad attempt.
    assert!(s.grad_norms.iter().filter(|(i, _)| *i != 3).all(|(_, n)| n.is_finite()));
}
