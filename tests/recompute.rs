//! `--recompute-granularity full` through `megatron pretrain`: with dropout on, every method
//! gives losses, grad norms and validation losses bit-identical to keeping the activations, on
//! one rank, at tp2·pp2 (1F1B keeps microbatches in flight) and in bf16; at tp2·pp2 with
//! dropout off it matches the single rank without recomputation (1e-5 relative). The hybrid
//! model and BERT likewise (fp32 and bf16, one rank and pp2; T5's bit-identity is
//! `cargo test -p megatron-t5 --test recompute`).

mod common;
use common::*;
use megatron::train::TrainSummary;

fn run(extra: &str) -> TrainSummary {
    let f = tiny_with(&format!(
        "--num-layers 4 --vocab-size 128 --make-vocab-size-divisible-by 64 --train-iters 8 --eval-interval 4 \
         --eval-iters 1 --log-interval 4 {extra}"
    ));
    pretrain(&f).unwrap_or_else(|e| panic!("[{extra}]: {e:#}"))
}

fn same(a: &TrainSummary, b: &TrainSummary, what: &str) {
    assert_eq!(a.losses, b.losses, "{what}: losses");
    assert_eq!(a.grad_norms, b.grad_norms, "{what}: grad norms");
    assert_eq!(a.valid_losses, b.valid_losses, "{what}: validation losses");
}

const FULL: [&str; 3] = [
    "--recompute-granularity full --recompute-method uniform",
    "--recompute-granularity full --recompute-method uniform --recompute-num-layers 2",
    "--recompute-granularity full --recompute-method block --recompute-num-layers 1",
];

#[test]
fn full_recompute_is_bit_identical_with_dropout() {
    for layout in ["", "--nproc 4 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2", "--bf16"] {
        let keep = run(layout);
        assert_eq!(keep.losses.len(), 8);
        for full in FULL {
            same(&run(&format!("{layout} {full}")), &keep, &format!("[{layout}] {full}"));
        }
    }
}

#[test]
fn full_recompute_at_tp2_pp2_matches_the_single_rank() {
    let off = "--hidden-dropout 0 --attention-dropout 0";
    let reference = run(off);
    let full =
        run(&format!("{off} --nproc 4 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 {}", FULL[1]));
    let (loss, norm) = (max_rel(&full.losses, &reference.losses), max_rel(&full.grad_norms, &reference.grad_norms));
    assert!(loss < 1e-5 && norm < 1e-5, "tp2·pp2 full recompute vs one rank: loss {loss:.2e}, grad norm {norm:.2e}");
}

const HYBRID: &str = "--model hybrid --num-layers 4 --hybrid-layer-pattern M*-M --normalization RMSNorm \
    --mamba-state-dim 8 --mamba-head-dim 8 --mamba-num-groups 2 --mamba-chunk-size 5";

#[test]
fn hybrid_full_recompute_is_bit_identical_with_dropout() {
    for layout in ["", "--bf16", "--nproc 2 --pipeline-model-parallel-size 2 --hybrid-layer-pattern M*|-M"] {
        let keep = run(&format!("{HYBRID} {layout}"));
        assert_eq!(keep.losses.len(), 8);
        for full in [FULL[0], FULL[2]] {
            same(&run(&format!("{HYBRID} {layout} {full}")), &keep, &format!("hybrid [{layout}] {full}"));
        }
    }
}

/// A 2-layer BERT on the synthetic sentence-split fixture, dropout on.
fn bert(extra: &str) -> TrainSummary {
    let f = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("datasets/tests/fixtures/bert");
    let args = flags(&format!(
        "--model bert --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 \
         --max-position-embeddings 32 --micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --seed 1234 \
         --hidden-dropout 0.1 --attention-dropout 0.1 --split 90,10,0 --train-iters 6 --eval-interval 3 \
         --eval-iters 1 --log-interval 3 --tokenizer-type BertWordPieceLowerCase --data-path {} \
         --vocab-file {} {extra}",
        f.join("synthetic_sentences").display(),
        f.join("vocab.txt").display()
    ));
    pretrain(&args).unwrap_or_else(|e| panic!("bert [{extra}]: {e:#}"))
}

#[test]
fn bert_full_recompute_is_bit_identical_with_dropout() {
    for layout in ["", "--bf16", "--nproc 2 --pipeline-model-parallel-size 2"] {
        let keep = bert(layout);
        assert_eq!(keep.losses.len(), 6);
        for full in [FULL[0], FULL[2]] {
            same(&bert(&format!("{layout} {full}")), &keep, &format!("bert [{layout}] {full}"));
        }
    }
}
