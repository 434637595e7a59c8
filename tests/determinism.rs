//! Training is bit-identical run to run (issue 10): with a busy competitor thread disturbing the
//! scheduling, across `--threads 1, 2 and 4`, and for save + resume on real data with dropout on.
//! The model is big enough that every reduction has several pieces (embedding 1000x64 = 4
//! chunks of the gradient norm, 256 to 1024 rows per micro batch = 8 to 32 LayerNorm row
//! blocks). On the kernels before the fix each test fails (the contention one at iteration ~5).

mod common;
use common::*;
use megatron::train::TrainSummary;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const MODEL: &str = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --lr 3e-3 --min-lr 3e-4 \
    --lr-decay-style cosine --lr-warmup-iters 3 --weight-decay 0.1 --clip-grad 1.0 --seed 7 \
    --eval-interval 1000 --eval-iters 1 --log-interval 1 --hidden-dropout 0.1 --attention-dropout 0.1";
const MOCK: &str = "--mock-data --vocab-size 1000 --seq-length 64 --max-position-embeddings 64 \
    --micro-batch-size 4 --global-batch-size 8";
/// 1024 rows per micro batch: 32 LayerNorm row blocks, more than rayon's initial split of a
/// 4-thread pool makes, so (before the fix) the combination tree followed the work stealing.
const MOCK_LONG: &str = "--mock-data --vocab-size 1000 --seq-length 128 --max-position-embeddings 128 \
    --micro-batch-size 8 --global-batch-size 8";

/// Busy threads that keep cores loaded until dropped, so the OS deschedules the pool's workers
/// at random moments and rayon's work stealing (and, before the fix, its split tree) varies.
struct Competitor(Arc<AtomicBool>, Vec<std::thread::JoinHandle<()>>);

impl Competitor {
    fn start(threads: usize) -> Competitor {
        let stop = Arc::new(AtomicBool::new(false));
        let handles = (0..threads)
            .map(|_| {
                let flag = stop.clone();
                std::thread::spawn(move || {
                    let mut v = vec![1.0f64; 1 << 16];
                    while !flag.load(Ordering::Relaxed) {
                        v.iter_mut().for_each(|x| *x = (*x * 1.000001).sin() + 1.0);
                        std::hint::black_box(&v);
                    }
                })
            })
            .collect();
        Competitor(stop, handles)
    }
}

impl Drop for Competitor {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        self.1.drain(..).for_each(|h| {
            let _ = h.join();
        });
    }
}

fn train(extra: &str) -> TrainSummary {
    pretrain(&flags(&format!("{MODEL} {extra}"))).unwrap_or_else(|e| panic!("pretrain {extra}: {e:#}"))
}

/// Losses and grad norms of `b` equal those of `a` bit for bit.
fn assert_bit_identical(what: &str, a: &TrainSummary, b: &TrainSummary) {
    assert_eq!(a.losses.len(), b.losses.len(), "{what}: iteration counts differ");
    for (name, x, y) in [("lm loss", &a.losses, &b.losses), ("grad norm", &a.grad_norms, &b.grad_norms)] {
        for ((i, u), (j, v)) in x.iter().zip(y) {
            assert_eq!(i, j, "{what}: iterations differ");
            assert_eq!(u.to_bits(), v.to_bits(), "{what}: {name} at iteration {i}: {u} vs {v}");
        }
    }
}

#[test]
fn two_runs_beside_a_busy_thread_are_bit_identical() {
    // The first run on a quiet machine, the second beside two busy threads.
    let a = train(&format!("{MOCK_LONG} --train-iters 10 --threads 4"));
    let busy = Competitor::start(2);
    let b = train(&format!("{MOCK_LONG} --train-iters 10 --threads 4"));
    drop(busy);
    assert_eq!(a.grad_norms.len(), 10, "every iteration reports its grad norm");
    assert_bit_identical("second run under contention", &a, &b);
}

#[test]
fn thread_counts_1_2_and_4_are_bit_identical() {
    let one = train(&format!("{MOCK} --train-iters 6 --threads 1"));
    // Megatron's --deterministic-mode is accepted and changes nothing: CPU runs always are.
    for (t, extra) in [(2, ""), (4, "--deterministic-mode")] {
        let run = train(&format!("{MOCK} --train-iters 6 --threads {t} {extra}"));
        assert_bit_identical(&format!("--threads {t} {extra} vs --threads 1"), &one, &run);
    }
}

#[test]
fn resume_on_tinyshakespeare_with_dropout_is_bit_identical_across_thread_counts() {
    let Some(data) = shared_data() else { return };
    let prefix = data.join("tinyshakespeare_gpt2_text_document");
    let gpt2 = data.join("gpt2");
    if !prefix.with_extension("idx").is_file() || !gpt2.join("vocab.json").is_file() {
        eprintln!("SKIP: tinyshakespeare_gpt2_text_document or gpt2/vocab.json missing in {}", data.display());
        return;
    }
    let real = format!(
        "--data-path {} --split 98,2,0 --seq-length 64 --max-position-embeddings 64 --tokenizer-type GPT2BPETokenizer --vocab-file {} --merge-file {}",
        prefix.display(),
        gpt2.join("vocab.json").display(),
        gpt2.join("merges.txt").display()
    );
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().join("ckpt");
    let save = save.to_str().unwrap();
    let _busy = Competitor::start(1);
    // One micro batch of 2 x 64 tokens per step keeps the 50304-row LM head affordable in tests.
    let real = format!("{real} --micro-batch-size 2 --global-batch-size 2 --train-iters 8");
    let straight = train(&format!("{real} --threads 1"));
    let first = train(&format!("{real} --exit-interval 4 --save {save} --save-interval 4 --threads 2"));
    let second = train(&format!("{real} --load {save} --threads 4"));
    assert_eq!(second.losses.first().map(|l| l.0), Some(5), "resume starts at iteration 5");
    let resumed = TrainSummary {
        losses: first.losses.iter().chain(&second.losses).cloned().collect(),
        grad_norms: first.grad_norms.iter().chain(&second.grad_norms).cloned().collect(),
        ..second
    };
    assert_bit_identical("4 + save + resume to 8 (threads 2 then 4) vs 8 straight (1 thread)", &straight, &resumed);
}
