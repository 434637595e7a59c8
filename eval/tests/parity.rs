//! `megatron-eval` against naive references on a tiny GPT (random weights, a character
//! tokenizer written here): the sliding-window loss equals per-window full-length logits
//! scored by a plain log-softmax, every target is scored exactly once, LAMBADA counts exactly
//! the examples built to be right, and tp = 2 (two ranks as threads) gives the tp = 1 result.

use megatron_comm_local::LocalCommunicator;
use megatron_core::{Backend, Model, ParallelContext, RankGrid, SpecialIds, Tokenizer};
use megatron_cpu::CpuBackend;
use megatron_eval::run::{EvalOptions, LogitsRank, ModelRank};
use megatron_eval::{evaluate, ClozeBoth, EvalDataset, EvalResult, Task};
use megatron_gpt::{GptConfig, GptModel};
use std::sync::Arc;

const ALPHABET: &str = "abcdefghijklmnopqrstuvwxyz .,'\"\n";
const VOCAB: usize = 33; // the alphabet + eod
const EOD: i32 = 32;
const SEQ: usize = 16;

/// One id per character of [`ALPHABET`].
struct CharTokenizer;

impl Tokenizer for CharTokenizer {
    fn name(&self) -> &str {
        "chars"
    }
    fn vocab_size(&self) -> usize {
        VOCAB
    }
    fn encode(&self, text: &str) -> anyhow::Result<Vec<u32>> {
        text.chars()
            .map(|c| ALPHABET.find(c).map(|i| i as u32).ok_or_else(|| anyhow::anyhow!("character {c:?}")))
            .collect()
    }
    fn decode(&self, ids: &[u32]) -> anyhow::Result<String> {
        Ok(ids.iter().map(|&i| ALPHABET.as_bytes().get(i as usize).map_or('#', |&b| b as char)).collect())
    }
    fn special_ids(&self) -> SpecialIds {
        SpecialIds { eod: Some(EOD as u32), ..Default::default() }
    }
    fn fingerprint(&self) -> String {
        "chars".into()
    }
}

fn config(llama: bool) -> GptConfig {
    let mut c = GptConfig::new(2, 16, 4, SEQ, VOCAB);
    c.hidden_dropout = 0.0;
    c.attention_dropout = 0.0;
    c.init_method_std = 0.5;
    c.padded_vocab_size = Some(36); // 3 padding ids, divisible by tp = 2
    c.seed = 5;
    if llama {
        c.num_query_groups = Some(2);
        c.position_embedding_type = "rope".into();
        c.normalization = megatron_transformer::NormKind::RMSNorm;
        c.swiglu = true;
        c.ffn_hidden_size = Some(24);
        c.add_bias_linear = false;
        c.untie_embeddings_and_output_weights = true;
    }
    c
}

fn backend() -> Arc<dyn Backend> {
    Arc::new(CpuBackend::new())
}

fn ranks(c: &GptConfig, tp: usize) -> Vec<Box<dyn LogitsRank>> {
    if tp == 1 {
        let model = GptModel::new(c.clone(), backend(), ParallelContext::single()).unwrap();
        return vec![Box::new(ModelRank { model, backend: backend() })];
    }
    let grid = RankGrid::new(tp, tp, 1, 1).unwrap();
    LocalCommunicator::world(tp, std::time::Duration::from_secs(60))
        .into_iter()
        .enumerate()
        .map(|(r, comm)| {
            let model = GptModel::new(c.clone(), backend(), grid.context(r, comm)).unwrap();
            Box::new(ModelRank { model, backend: backend() }) as Box<dyn LogitsRank>
        })
        .collect()
}

/// The original path (whole logits) and, checked against it, the output layer on the scored
/// rows only: the same verdicts and per-sample losses to rounding.
fn run(c: &GptConfig, tp: usize, ds: &EvalDataset, mbs: usize) -> EvalResult {
    let opts = |full_logits| EvalOptions { micro_batch_size: mbs, vocab_size: VOCAB, full_logits };
    let full = evaluate(ranks(c, tp), ds, opts(true), &mut |_, _| {}).unwrap();
    let rows = evaluate(ranks(c, tp), ds, opts(false), &mut |_, _| {}).unwrap();
    assert_eq!((rows.correct.clone(), rows.scored_targets), (full.correct.clone(), full.scored_targets));
    assert_eq!(rows.nll.len(), ds.len());
    for (a, b) in rows.nll.iter().zip(&full.nll) {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "partial logits loss {a} vs full {b}");
    }
    assert!((rows.output - full.output).abs() <= 1e-5 * full.output.abs().max(1.0));
    full
}

/// Full-length `(SEQ, V_padded)` logits of one sample at tp = 1.
fn full_logits(model: &mut GptModel, tokens: &[i32]) -> Vec<f32> {
    let t = model.logits(&tokens[..SEQ], 1, SEQ).unwrap();
    model.backend().to_host(&t).unwrap().to_f32_vec()
}

/// `(-log p(target), argmax)` over the unpadded vocabulary, in f64.
fn naive(row: &[f32], target: i32) -> (f64, i32) {
    let row = &row[..VOCAB];
    let m = row.iter().fold(f64::NEG_INFINITY, |a, &x| a.max(x as f64));
    let z: f64 = row.iter().map(|&x| (x as f64 - m).exp()).sum();
    let arg = row.iter().position(|&x| x as f64 == m).unwrap() as i32;
    (z.ln() + m - row[target as usize] as f64, arg)
}

const TEXT: &str = "the quick brown fox jumps over the lazy dog, \"said\" the old man.\nit was the best of times, \
                    it was the worst of times, it was the age of wisdom.\n";

#[test]
fn windows_match_naive_scoring_and_tp2() {
    for llama in [false, true] {
        let c = config(llama);
        let mut model = GptModel::new(c.clone(), backend(), ParallelContext::single()).unwrap();
        for stride in [SEQ, 5] {
            let ds = EvalDataset::windows(TEXT, &CharTokenizer, SEQ, EOD, Some(stride), None).unwrap();
            let n_tokens = TEXT.chars().count();
            assert_eq!(ds.num_tokenized_tokens, n_tokens);
            // Naive: every window at full length, scored where its mask says; count each target.
            let mut want = 0.0;
            let mut seen = vec![0usize; n_tokens];
            for i in 0..ds.len() {
                let x = ds.sample(i);
                let logits = full_logits(&mut model, &x.tokens);
                for t in 0..SEQ {
                    if x.loss_mask[t] != 0.0 {
                        want += naive(&logits[t * 36..(t + 1) * 36], x.tokens[t + 1]).0;
                        seen[(i * stride).min(n_tokens) + t + 1] += 1;
                    }
                }
            }
            assert!(seen[1..].iter().all(|&k| k == 1), "stride {stride}: every target once: {seen:?}");
            let got = run(&c, 1, &ds, 3);
            assert_eq!(got.scored_targets, n_tokens - 1);
            let rel = (got.output - want).abs() / want;
            assert!(rel < 1e-6, "llama {llama} stride {stride}: loss sum {} vs naive {want}", got.output);
            let tp2 = run(&c, 2, &ds, 4);
            let rel2 = (tp2.output - got.output).abs() / got.output;
            assert!(rel2 < 1e-5, "llama {llama} stride {stride}: tp2 {} vs tp1 {}", tp2.output, got.output);
            let (loss, ppl, adj, ratio) = got.perplexity();
            assert!((ppl - loss.min(20.0).exp()).abs() < 1e-9 * ppl);
            assert!((adj - (loss * ratio).min(20.0).exp()).abs() < 1e-9 * adj);
            // Character tokens vs space-separated words.
            let words = TEXT.trim().split(' ').count();
            assert!((ratio - (n_tokens - 1) as f64 / (words - 1) as f64).abs() < 1e-12);
        }
    }
}

/// Cloze texts for `model`: context `i` ends with the model's own greedy next character when
/// `i` is even, else with another character, so exactly the even ones are correct
/// (non-strict: last token). Returns the texts and the number built to be right. The last
/// context has no space: strict leaves it no context.
fn built_texts(model: &mut GptModel) -> (Vec<String>, f64) {
    let contexts =
        ["the old man sa", "it was the wor", "a quick fox", "over the lazy d", "best of ti", "no, said he", "wisdom."];
    let mut texts = Vec::new();
    let mut want = 0.0;
    for (i, ctx) in contexts.iter().enumerate() {
        let ids: Vec<i32> = CharTokenizer.encode(ctx).unwrap().into_iter().map(|x| x as i32).collect();
        let mut padded = ids.clone();
        padded.resize(SEQ + 1, EOD);
        let logits = full_logits(model, &padded);
        let p = ids.len() - 1;
        let (_, best) = naive(&logits[p * 36..(p + 1) * 36], 0);
        let right = i % 2 == 0 && best != EOD; // eod cannot be written as text
        want += right as u8 as f64;
        let next = if right { best } else { (best + 1) % EOD };
        texts.push(format!("{ctx}{}", ALPHABET.as_bytes()[next as usize] as char));
    }
    (texts, want)
}

#[test]
fn lambada_counts_exactly_the_examples_built_to_be_right() {
    let c = config(true);
    let mut model = GptModel::new(c.clone(), backend(), ParallelContext::single()).unwrap();
    let (texts, want) = built_texts(&mut model);
    let n = texts.len();
    let ds = EvalDataset::cloze(&texts, &CharTokenizer, SEQ, EOD, false).unwrap();
    assert!(want >= 1.0, "the model predicts eod everywhere; change the seed");
    for (tp, mbs) in [(1, 1), (1, 3), (2, 2)] {
        let got = run(&c, tp, &ds, mbs);
        assert_eq!(got.output, want, "tp {tp} micro batch {mbs}");
        let even: Vec<bool> = (0..n).map(|i| i % 2 == 0).collect();
        assert!(got.correct.iter().zip(&even).all(|(&c, &e)| !c || e), "only even examples can be right");
        assert_eq!(got.samples, n);
    }
    // Strict: targets are " " + the last word; the count equals the naive one.
    let strict = EvalDataset::cloze(&texts, &CharTokenizer, SEQ, EOD, true).unwrap();
    let mut naive_correct = 0.0;
    for i in 0..strict.len() {
        let x = strict.sample(i);
        let logits = full_logits(&mut model, &x.tokens);
        let ok = (0..SEQ)
            .filter(|&t| x.loss_mask[t] != 0.0)
            .all(|t| naive(&logits[t * 36..(t + 1) * 36], 0).1 == x.tokens[t + 1]);
        naive_correct += ok as u8 as f64;
    }
    assert_eq!(run(&c, 2, &strict, 3).output, naive_correct);
    assert_eq!(run(&c, 1, &strict, 2).output, naive_correct);
}

#[test]
fn strict_split_and_result_lines() {
    let (ctx, tgt) = megatron_eval::tasks::split_cloze("he said  hello ", &CharTokenizer, true).unwrap();
    assert_eq!(CharTokenizer.decode(&ctx.iter().map(|&x| x as u32).collect::<Vec<_>>()).unwrap(), "he said");
    assert_eq!(CharTokenizer.decode(&tgt.iter().map(|&x| x as u32).collect::<Vec<_>>()).unwrap(), " hello");
    let (ctx, tgt) = megatron_eval::tasks::split_cloze("he said hello", &CharTokenizer, false).unwrap();
    assert_eq!((ctx.len(), tgt), (12, vec![14]));

    let r = EvalResult {
        task: Task::Lambada,
        samples: 5153,
        output: 1691.0,
        num_tokenized_tokens: 5153,
        num_original_tokens: 5153,
        scored_targets: 5153,
        seconds: 1.0,
        correct: Vec::new(),
        nll: Vec::new(),
    };
    // As Megatron's '{:.4E}'.format prints them.
    assert_eq!(
        r.result_line(),
        " validation results on LAMBADA | number correct: 1.6910E+03 | total examples: 5.1530E+03 | avg accuracy: 3.2816E-01"
    );
    let w = EvalResult {
        task: Task::Wikitext103,
        output: 3.0 * 240.0,
        num_tokenized_tokens: 241,
        num_original_tokens: 201,
        ..r
    };
    assert_eq!(
        w.result_line(),
        " validation results on WIKITEXT103 | avg loss: 3.0000E+00 | ppl: 2.0086E+01 | adjusted ppl: 3.6598E+01 | token ratio: 1.2 |"
    );
    let block = w.report();
    let lines: Vec<&str> = block.lines().collect();
    assert_eq!(lines[0].len(), lines[1].len() + 1);
    assert!(lines[0].chars().all(|c| c == '-') && lines[0] == lines[2]);
}

#[test]
fn olmo_requests_and_megatron_jsonl_give_the_same_passages() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("lambada.jsonl");
    std::fs::write(&jsonl, "{\"text\": \"the cat sat on the mat\"}\n\n{\"text\": \"a dog\"}\n").unwrap();
    let gz = dir.path().join("requests.jsonl.gz");
    let mut enc = flate2::write::GzEncoder::new(std::fs::File::create(&gz).unwrap(), flate2::Compression::fast());
    for (c, w) in [("the cat sat on the", " mat"), ("a", " dog")] {
        writeln!(enc, "{}", serde_json::json!({"request": {"context": c, "continuation": w}, "doc_id": 0})).unwrap();
    }
    enc.finish().unwrap();
    let (a, fa) = megatron_eval::lambada_io::read_passages(&jsonl, None).unwrap();
    let (b, fb) = megatron_eval::lambada_io::read_passages(&gz, None).unwrap();
    assert_eq!(a, b);
    assert_ne!(fa, fb);
    assert_eq!(megatron_eval::lambada_io::read_passages(&gz, Some(1)).unwrap().0.len(), 1);
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"txt\": 1}\n").unwrap();
    let err = format!("{:#}", megatron_eval::lambada_io::read_passages(&bad, None).unwrap_err());
    assert!(err.contains("bad.jsonl:1") && err.contains("request.context"), "{err}");
}

#[test]
fn both_rules_from_shared_forwards_equal_each_rule_alone() {
    let c = config(true);
    let mut model = GptModel::new(c.clone(), backend(), ParallelContext::single()).unwrap();
    let (mut texts, _) = built_texts(&mut model);
    // Strict ids differ from the whole text's here (two spaces; trailing space): own forwards.
    texts.extend(["he said  hello".to_string(), "it was the age ".to_string()]);
    let both = ClozeBoth::new(&texts, &CharTokenizer, SEQ, EOD).unwrap();
    // Shared: every built text but the space-less last one.
    assert_eq!((both.shared, both.sequences()), (6, 6 + 2 * 3));
    for (tp, mbs) in [(1, 1), (1, 4), (2, 3)] {
        for full_logits in [false, true] {
            let opts = EvalOptions { micro_batch_size: mbs, vocab_size: VOCAB, full_logits };
            let got = both.evaluate(ranks(&c, tp), opts, &mut |_, _| {}).unwrap();
            for (rule, strict) in [(0, false), (1, true)] {
                let alone = run(&c, tp, &EvalDataset::cloze(&texts, &CharTokenizer, SEQ, EOD, strict).unwrap(), 1);
                let g = &got[rule];
                let what = format!("tp {tp} mbs {mbs} full {full_logits} strict {strict}");
                assert_eq!(
                    (&g.correct, g.output, g.scored_targets),
                    (&alone.correct, alone.output, alone.scored_targets),
                    "{what}"
                );
                for (a, b) in g.nll.iter().zip(&alone.nll) {
                    assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{what}: loss {a} vs {b}");
                }
            }
            assert!(got[0].output >= 1.0, "the built-to-be-right examples must count");
        }
    }
}
