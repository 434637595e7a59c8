//! The generation engine on a tiny random GPT: kv-cache generation equals full recompute
//! (tokens and log-probs), a mixed-length batch equals each prompt alone, seeded sampling is
//! reproducible, stop tokens end rows, and `megatron generate` runs end to end on a checkpoint
//! written by `megatron pretrain`.

mod common;

use megatron::generate::{GenerationParams, Generator, SamplingParams};
use megatron_core::{Backend, Model, ParallelContext};
use megatron_gpt::{GptConfig, GptModel};
use std::sync::Arc;

fn model() -> GptModel {
    let mut c = GptConfig::new(2, 32, 4, 32, 60);
    c.hidden_dropout = 0.0;
    c.attention_dropout = 0.0;
    c.init_method_std = 0.2;
    c.make_vocab_size_divisible_by = 16;
    let backend: Arc<dyn Backend> = Arc::new(megatron_cpu::CpuBackend::new());
    GptModel::new(c, backend, ParallelContext::single()).unwrap()
}

fn prompts() -> Vec<Vec<i32>> {
    vec![vec![3, 14, 15, 9, 2, 6], vec![5, 35], vec![8, 9, 7, 9, 3, 2, 3, 8, 4]]
}

fn run(m: &mut GptModel, prompts: &[Vec<i32>], p: &GenerationParams) -> megatron::generate::Generated {
    Generator { model: m, vocab_size: 60, pad_id: 59 }.generate(prompts, p, &mut |_, _| true).unwrap()
}

#[test]
fn kv_cache_equals_recompute_and_batching_equals_single_prompts() {
    let mut m = model();
    let greedy = GenerationParams { tokens_to_generate: 12, sampling: SamplingParams::greedy(), ..Default::default() };
    let cached = run(&mut m, &prompts(), &greedy);
    let full = run(&mut m, &prompts(), &GenerationParams { use_kv_cache: false, ..greedy.clone() });
    assert_eq!(cached.tokens, full.tokens);
    for (a, b) in cached.logprobs.iter().zip(&full.logprobs) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-4, "log-prob {x} vs {y}");
        }
    }
    // Mixed prompt lengths: each row equals its prompt generated alone.
    for (r, p) in prompts().iter().enumerate() {
        let alone = run(&mut m, std::slice::from_ref(p), &greedy);
        assert_eq!(alone.tokens[0], cached.tokens[r], "row {r}");
        assert_eq!(cached.tokens[r].len(), p.len() + 12);
        assert_eq!(cached.logprobs[r].len(), p.len() + 11);
    }
    // Log-probs are log_softmax of a full forward at every position after the first.
    let row = &cached.tokens[1];
    let logits = m.logits(row, 1, row.len()).unwrap();
    let logits = m.backend().to_host(&logits).unwrap().to_f32_vec();
    let vp = logits.len() / row.len();
    for pos in 1..row.len() {
        let want =
            megatron::generate::sampling::log_prob(&logits[(pos - 1) * vp..(pos - 1) * vp + 60], row[pos] as usize);
        assert!((cached.logprobs[1][pos - 1] - want).abs() < 1e-4, "position {pos}");
    }
}

#[test]
fn seeded_sampling_is_reproducible_and_stop_tokens_end_rows() {
    let mut m = model();
    let p = GenerationParams {
        tokens_to_generate: 10,
        sampling: SamplingParams { temperature: 1.5, top_p: 0.9, ..Default::default() },
        seed: 42,
        ..Default::default()
    };
    let a = run(&mut m, &prompts(), &p);
    let b = run(&mut m, &prompts(), &p);
    assert_eq!(a.tokens, b.tokens);
    let c = run(&mut m, &prompts(), &GenerationParams { seed: 43, ..p.clone() });
    assert_ne!(a.tokens, c.tokens, "a different seed should change some sample");

    // Make the first generated token of row 0 a stop token: that row ends right after it.
    let stop = a.tokens[0][6];
    let s = run(&mut m, &prompts(), &GenerationParams { stop_tokens: vec![stop], ..p.clone() });
    assert_eq!(s.tokens[0].len(), 7);
    assert_eq!(*s.tokens[0].last().unwrap(), stop);
    assert_eq!(s.logprobs[0].len(), 6);

    let mut streamed = Vec::new();
    Generator { model: &mut m, vocab_size: 60, pad_id: 59 }
        .generate(&prompts()[..1], &p, &mut |r, t| {
            streamed.push((r, t));
            true
        })
        .unwrap();
    let alone = run(&mut m, &prompts()[..1], &p);
    assert_eq!(streamed.iter().map(|x| x.1).collect::<Vec<_>>(), alone.tokens[0][6..].to_vec());
    // Aborting from the callback (a disconnected client) is an error, not a panic.
    let err = Generator { model: &mut m, vocab_size: 60, pad_id: 59 }.generate(&prompts(), &p, &mut |_, _| false);
    assert!(err.unwrap_err().to_string().contains("aborted"));
    let long = GenerationParams { tokens_to_generate: 30, ..p };
    let err = Generator { model: &mut m, vocab_size: 60, pad_id: 59 }.generate(&prompts(), &long, &mut |_, _| true);
    assert!(err.unwrap_err().to_string().contains("max_position_embeddings"));
}

#[test]
fn generate_cli_on_a_pretrained_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().join("ckpt");
    let flags = common::tiny_with(&format!(
        "--train-iters 4 --save {} --save-interval 4 --log-interval 1 --eval-interval 100",
        save.display()
    ));
    common::pretrain(&flags).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_megatron"))
        .args(["generate", "--load"])
        .arg(&save)
        .args(["--prompt", "1 2 3 4", "--tokens-to-generate", "5", "--top-k", "1"])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "stdout {stdout}\nstderr {stderr}");
    let ids: Vec<&str> = stdout.split_whitespace().collect();
    assert!(ids.len() >= 5 && ids[..4] == ["1", "2", "3", "4"], "{stdout}");
    assert!(stderr.contains("ms/token"), "{stderr}");
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_megatron"))
        .args(["generate", "--load"])
        .arg(&save)
        .args(["--prompt", "1", "--top-k", "2", "--top-p", "0.5"])
        .output()
        .unwrap();
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("cannot be combined"));
}
