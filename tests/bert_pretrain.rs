//! `megatron pretrain --model bert` end to end on the synthetic sentence-split fixture of the
//! BERT dataset tests (216-token WordPiece vocabulary, 120 documents): Megatron's samples
//! (packed by the `bert` dataset, unpacked by the model), `lm loss` and `sop loss` logged;
//! tp = 2, dp = 2, pp = 2 and tp2·pp2 (ranks as threads, 1F1B) match the single-rank run;
//! `--bf16`/`--fp16` follow the fp32 run within the half type's rounding; bad
//! flag combinations are refused with messages naming the fix.

mod common;
use common::*;
use std::path::PathBuf;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("datasets/tests/fixtures/bert")
}

/// A 2-layer, 32-wide BERT on sequences of 32; dropout off so layouts are comparable.
fn bert_flags(extra: &str) -> Vec<String> {
    bert_flags_layers(2, extra)
}

/// [`bert_flags`] with `layers` encoder layers.
fn bert_flags_layers(layers: usize, extra: &str) -> Vec<String> {
    let f = fixture();
    let mut v = flags(&format!(
        "--model bert --num-layers {layers} --hidden-size 32 --num-attention-heads 4 --seq-length 32 \
         --max-position-embeddings 32 --micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 \
         --lr-decay-style cosine --lr-warmup-iters 2 --weight-decay 0.01 --clip-grad 1.0 --seed 1234 \
         --hidden-dropout 0 --attention-dropout 0 --split 90,10,0 --eval-interval 6 --eval-iters 1 \
         --log-interval 3 --tokenizer-type BertWordPieceLowerCase --data-path {} --vocab-file {}",
        f.join("synthetic_sentences").display(),
        f.join("vocab.txt").display()
    ));
    v.extend(flags(extra));
    v
}

/// The values of one `--metrics-jsonl` tag, in order.
fn tag_values(path: &std::path::Path, tag: &str) -> Vec<f64> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["tag"] == tag)
        .filter_map(|v| v.get("value").and_then(|x| x.as_f64()))
        .collect()
}

/// The training `sop loss` values, then the validation ones (`sop loss validation`).
fn sop_losses(path: &std::path::Path) -> Vec<f64> {
    let mut v = tag_values(path, "sop loss");
    v.extend(tag_values(path, "sop loss validation"));
    v
}

/// A 12-iteration run of `bert_flags(extra)` (jsonl metrics in `dir`): the summary and its
/// sop losses (training, then validation).
fn run_bert(dir: &std::path::Path, name: &str, extra: &str) -> (megatron::train::TrainSummary, Vec<f64>) {
    run_bert_layers(dir, name, 2, extra)
}

/// [`run_bert`] with `layers` encoder layers.
fn run_bert_layers(
    dir: &std::path::Path,
    name: &str,
    layers: usize,
    extra: &str,
) -> (megatron::train::TrainSummary, Vec<f64>) {
    let jsonl = dir.join(format!("{name}.jsonl"));
    let s =
        pretrain(&bert_flags_layers(layers, &format!("--train-iters 12 --metrics-jsonl {} {extra}", jsonl.display())))
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
    (s, sop_losses(&jsonl))
}

/// Losses, gradient norms, sop losses (training and validation) and validation losses of a
/// parallel run equal the reference's within 1e-5 relative.
fn assert_same_run(
    name: &str,
    (s, sop): &(megatron::train::TrainSummary, Vec<f64>),
    (reference, sop_ref): &(megatron::train::TrainSummary, Vec<f64>),
) {
    for (a, b) in [
        (&s.losses, &reference.losses),
        (&s.grad_norms, &reference.grad_norms),
        (&s.valid_losses, &reference.valid_losses),
    ] {
        assert_eq!(a.len(), b.len(), "{name}");
        for ((i, x), (_, y)) in a.iter().zip(b.iter()) {
            assert!((x - y).abs() <= 1e-5 * y.abs(), "{name} iteration {i}: {x} vs single rank {y}");
        }
    }
    assert_eq!(sop.len(), sop_ref.len(), "{name}");
    for (x, y) in sop.iter().zip(sop_ref) {
        assert!((x - y).abs() <= 1e-5 * y.abs(), "{name} sop loss {x} vs single rank {y}");
    }
}

#[test]
fn bert_pretrains_and_tp2_dp2_pp2_match_the_single_rank_run() {
    let dir = tempfile::tempdir().unwrap();
    let reference = run_bert(dir.path(), "tp1", "");
    let (summary, sop_ref) = &reference;
    assert_eq!(summary.losses.len(), 12);
    // 4 log lines' sop averages, then 3 validation passes' (iterations 6, 12 and the final
    // one), each near ln 2 at the start of training.
    assert_eq!(sop_ref.len(), 4 + 3, "sop loss values: {sop_ref:?}");
    assert!(sop_ref.iter().all(|s| s.is_finite() && (0.3..1.2).contains(s)), "{sop_ref:?}");
    let first = summary.losses[0].1;
    // 216 vocab.txt entries + Megatron's [BOS] and [EOS].
    assert!((first - (218f64).ln()).abs() < 0.5, "initial lm loss {first} should be near ln(218)");
    assert_eq!(summary.valid_losses.len(), 3);
    for (name, extra) in [
        ("tp2", "--nproc 2 --tensor-model-parallel-size 2"),
        ("dp2", "--nproc 2"),
        ("pp2", "--nproc 2 --pipeline-model-parallel-size 2"),
        ("tp2pp2", "--nproc 4 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"),
    ] {
        assert_same_run(name, &run_bert(dir.path(), name, extra), &reference);
    }
}

#[test]
fn bert_bf16_and_fp16_follow_the_fp32_run() {
    // Half parameters and activations (SPEC §6.7, docs/mixed_precision.md); fp16 with a fixed
    // loss scale (the dynamic scaler would skip the first iterations from its 2^32 start).
    let dir = tempfile::tempdir().unwrap();
    let (fp32, _) = run_bert(dir.path(), "fp32", "");
    let (bf16, _) = run_bert(dir.path(), "bf16", "--bf16");
    let (fp16, _) = run_bert(dir.path(), "fp16", "--fp16 --loss-scale 1024");
    let (bf16_pp2, _) = run_bert(dir.path(), "bf16pp2", "--bf16 --nproc 2 --pipeline-model-parallel-size 2");
    for (name, s, tol) in [("bf16", &bf16, 2e-3), ("fp16", &fp16, 5e-4)] {
        let (loss, valid) = (max_rel(&s.losses, &fp32.losses), max_rel(&s.valid_losses, &fp32.valid_losses));
        eprintln!("{name} vs fp32: loss rel {loss:.2e}, validation loss rel {valid:.2e}");
        assert!(loss < tol && valid < tol, "{name} vs fp32: loss rel {loss:.2e}, validation {valid:.2e} (tol {tol})");
    }
    // Pipeline stages exchange bf16 hidden states: the same run as one rank.
    let loss = max_rel(&bf16_pp2.losses, &bf16.losses);
    assert!(loss < 1e-5, "bf16 pp2 vs one rank: loss rel {loss:.2e}");
}

#[test]
fn bert_uneven_pipeline_splits_match_the_single_rank_run() {
    // Megatron's --decoder-first/last-pipeline-num-layers: 3 encoder layers as 2 + 1 and 1 + 2
    // train the same model as one rank (global layer numbers: same names, init, dropout).
    let dir = tempfile::tempdir().unwrap();
    let reference = run_bert_layers(dir.path(), "l3", 3, "");
    let pp2 = "--nproc 2 --pipeline-model-parallel-size 2";
    for (name, extra) in [
        ("first2", format!("{pp2} --decoder-first-pipeline-num-layers 2")),
        ("last2", format!("{pp2} --decoder-last-pipeline-num-layers 2")),
    ] {
        assert_same_run(name, &run_bert_layers(dir.path(), name, 3, &extra), &reference);
    }
    let err = format!(
        "{:#}",
        pretrain(&bert_flags_layers(3, &format!("--train-iters 1 {pp2} --decoder-first-pipeline-num-layers 3")))
            .unwrap_err()
    );
    assert!(err.contains("--decoder-first-pipeline-num-layers 3") && err.contains("1 other stage"), "{err}");
}

#[test]
fn bert_validation_prints_lm_and_sop_loss() {
    // The framed validation line carries both losses, as Megatron's `evaluate_and_print_results`.
    let line = megatron::train::log::validation_block_with("iteration 6", 5.0, &[("sop loss".into(), 0.7)]);
    assert!(
        line.contains(
            "| lm loss value: 5.000000E+00 | lm loss PPL: 1.484132E+02 | sop loss value: 7.000000E-01 | sop loss \
             PPL: 2.013753E+00 |"
        ),
        "{line}"
    );
}

#[test]
fn bert_lm_loss_goes_down() {
    // The fixture's words are random, so there is nothing general to learn: train on 3 of its
    // 120 documents (their samples repeat, re-masked, every few iterations) and the masked-LM
    // loss falls clearly (on the full fixture it stays at ln V) as the model learns them.
    let s = pretrain(&bert_flags(
        "--train-iters 40 --lr 1e-2 --min-lr 1e-3 --eval-iters 0 --split 3,97,0 --bert-no-binary-head",
    ))
    .unwrap();
    let mean = |r: &[(u64, f64)]| r.iter().map(|x| x.1).sum::<f64>() / r.len() as f64;
    let (start, end) = (mean(&s.losses[..5]), mean(&s.losses[35..]));
    println!("lm loss: first 5 iterations {start:.3}, last 5 {end:.3}");
    assert!(end < start - 0.4, "lm loss {start:.3} -> {end:.3} did not go down");
}

#[test]
fn bert_flag_errors_name_the_fix() {
    let err = |extra: &str| format!("{:#}", pretrain(&bert_flags(extra)).unwrap_err());
    assert!(err("--train-iters 1 --context-parallel-size 2 --nproc 2").contains("--context-parallel-size 1"));
    let e = err("--train-iters 1 --pipeline-model-parallel-size 2 --nproc 2 --num-layers 3");
    assert!(e.contains("multiple of --pipeline-model-parallel-size 2") && e.contains("uneven split"), "{e}");
    assert!(err("--train-iters 1 --swiglu").contains("LayerNorm, GeLU"));
    let mut no_vocab = bert_flags("--train-iters 1");
    let i = no_vocab.iter().position(|f| f == "--tokenizer-type").unwrap();
    no_vocab[i + 1] = "GPT2BPETokenizer".into();
    let e = format!("{:#}", pretrain(&no_vocab).unwrap_err());
    assert!(e.contains("BertWordPieceLowerCase"), "{e}");
}

#[test]
fn bert_data_inspect_shows_masked_samples() {
    use clap::Parser;
    let f = fixture();
    let argv = format!(
        "megatron data inspect {} --model bert --seq-length 32 --num-samples 10 --show 2 \
         --tokenizer-type BertWordPieceLowerCase --vocab-file {}",
        f.join("synthetic_sentences").display(),
        f.join("vocab.txt").display()
    );
    let cli = megatron::cli::Cli::try_parse_from(argv.split_whitespace()).unwrap();
    let megatron::cli::Command::Data { command: megatron::tools::data_inspect::DataCommand::Inspect(a) } = cli.command
    else {
        unreachable!()
    };
    let out = megatron::tools::data_inspect::inspect(&a, &megatron_core::Registry::builtin().unwrap()).unwrap();
    println!("{out}");
    assert!(out.contains("binary head: true"), "{out}");
    assert_eq!(out.matches("is_random").count(), 2, "{out}");
    // Masked positions as [shown→label], segments split by `|`.
    assert!(out.contains('→') && out.contains(" | "), "{out}");
}
