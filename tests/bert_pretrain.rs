//! `megatron pretrain --model bert` end to end on the synthetic sentence-split fixture of the
//! BERT dataset tests (216-token WordPiece vocabulary, 120 documents): Megatron's samples
//! (packed by the `bert` dataset, unpacked by the model), `lm loss` and `sop loss` logged;
//! tp = 2, dp = 2, pp = 2 and tp2·pp2 (ranks as threads, 1F1B) match the single-rank run; bad
//! flag combinations are refused with messages naming the fix.

mod common;
use common::*;
use std::path::PathBuf;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("datasets/tests/fixtures/bert")
}

/// A 2-layer, 32-wide BERT on sequences of 32; dropout off so layouts are comparable.
fn bert_flags(extra: &str) -> Vec<String> {
    let f = fixture();
    let mut v = flags(&format!(
        "--model bert --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 \
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

/// The `sop loss` values of a `--metrics-jsonl` file, in order.
fn sop_losses(path: &std::path::Path) -> Vec<f64> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["tag"] == "sop loss")
        .filter_map(|v| v.get("value").and_then(|x| x.as_f64()))
        .collect()
}

#[test]
fn bert_pretrains_and_tp2_dp2_pp2_match_the_single_rank_run() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, extra: &str| {
        let jsonl = dir.path().join(format!("{name}.jsonl"));
        let s = pretrain(&bert_flags(&format!("--train-iters 12 --metrics-jsonl {} {extra}", jsonl.display())))
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        (s, sop_losses(&jsonl))
    };
    let (reference, sop_ref) = run("tp1", "");
    assert_eq!(reference.losses.len(), 12);
    // 4 log lines' sop averages, each near ln 2 at the start of training.
    assert_eq!(sop_ref.len(), 4, "sop loss values: {sop_ref:?}");
    assert!(sop_ref.iter().all(|s| s.is_finite() && (0.3..1.2).contains(s)), "{sop_ref:?}");
    let first = reference.losses[0].1;
    // 216 vocab.txt entries + Megatron's [BOS] and [EOS].
    assert!((first - (218f64).ln()).abs() < 0.5, "initial lm loss {first} should be near ln(218)");
    assert_eq!(reference.valid_losses.len(), 3);
    for (name, extra) in [
        ("tp2", "--nproc 2 --tensor-model-parallel-size 2"),
        ("dp2", "--nproc 2"),
        ("pp2", "--nproc 2 --pipeline-model-parallel-size 2"),
        ("tp2pp2", "--nproc 4 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"),
    ] {
        let (s, sop) = run(name, extra);
        for (a, b) in [(&s.losses, &reference.losses), (&s.grad_norms, &reference.grad_norms)] {
            for ((i, x), (_, y)) in a.iter().zip(b.iter()) {
                assert!((x - y).abs() <= 1e-5 * y.abs(), "{name} iteration {i}: {x} vs single rank {y}");
            }
        }
        for (x, y) in sop.iter().zip(&sop_ref) {
            assert!((x - y).abs() <= 1e-5 * y.abs(), "{name} sop loss {x} vs single rank {y}");
        }
        assert_eq!(sop.len(), sop_ref.len());
        assert_eq!(s.valid_losses.len(), reference.valid_losses.len());
    }
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
    assert!(err("--train-iters 1 --pipeline-model-parallel-size 2 --nproc 2 --num-layers 3").contains("even split"));
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
