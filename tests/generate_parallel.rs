//! `megatron generate --nproc 2` at tensor parallel size 2 and at pipeline parallel size 2
//! (ranks as threads; rank 0 runs the static-batching [`Generator`], the others follow its
//! model calls) gives the tokens of the single-rank generator: greedy and seeded sampling, a
//! batch of prompts of different lengths; log-probs within 1e-4 (the TP all-reduces sum in
//! another order than the tp = 1 GEMM). Through the library and through the CLI.

mod common;

use megatron::generate::ranks::with_followers;
use megatron::generate::{load_model, Generated, GenerationParams, Generator, LoadArgs, LoadedModel, SamplingParams};
use megatron::serve::ranks::load_ranks;
use megatron_core::Registry;
use megatron_gpt::GptModel;
use std::path::{Path, PathBuf};

fn prompts() -> Vec<Vec<i32>> {
    vec![vec![5, 6, 7], vec![11], vec![3, 1, 4, 1, 5, 9, 2, 6], vec![42, 17, 8, 99, 23]]
}

fn params(sampled: bool) -> GenerationParams {
    let sampling = if sampled {
        SamplingParams { temperature: 1.0, ..SamplingParams::default() }
    } else {
        SamplingParams::greedy()
    };
    GenerationParams { tokens_to_generate: 8, sampling, seed: 11, ..GenerationParams::default() }
}

fn generate(loaded: &mut LoadedModel, sampled: bool) -> Generated {
    let mut g = Generator { model: &mut loaded.model, vocab_size: loaded.vocab_size, pad_id: loaded.eod };
    g.generate(&prompts(), &params(sampled), &mut |_, _| true).unwrap()
}

fn assert_same(what: &str, got: &Generated, want: &Generated) {
    assert_eq!(got.tokens, want.tokens, "{what}: tokens differ from tp = pp = 1");
    let worst =
        got.logprobs.iter().flatten().zip(want.logprobs.iter().flatten()).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(worst < 1e-4, "{what}: log-probs differ from tp = pp = 1 by {worst}");
    eprintln!("{what}: tokens identical to tp = pp = 1, log-probs max |diff| {worst:.2e}");
}

fn checkpoint(dir: &Path) -> PathBuf {
    let save = dir.join("ckpt");
    let flags = common::tiny_with(&format!(
        "--train-iters 4 --lr-warmup-iters 1 --seq-length 32 --max-position-embeddings 32 --init-method-std 0.2 --save {} \
         --save-interval 4 --log-interval 10 --eval-interval 100",
        save.display()
    ));
    common::pretrain(&flags).unwrap();
    save
}

#[test]
fn generation_at_tp2_and_pp2_matches_one_rank() {
    let dir = tempfile::tempdir().unwrap();
    let save = checkpoint(dir.path());
    let registry = Registry::builtin().unwrap();
    let load = LoadArgs { load: save.clone(), backend: "cpu".into(), threads: Some(1), ..Default::default() };
    let mut one = load_model(&registry, &load).unwrap();
    let (greedy, sampled) = (generate(&mut one, false), generate(&mut one, true));
    assert_ne!(greedy.tokens, sampled.tokens, "sampling must differ from greedy (the test can fail)");
    for (what, tp, pp) in [("tp2", 2, 1), ("pp2", 1, 2)] {
        let (mut rank0, followers): (LoadedModel, Vec<GptModel>) = load_ranks(&registry, &load, 2, tp, pp).unwrap();
        let (g, s) = with_followers(&mut rank0, followers, |l| Ok((generate(l, false), generate(l, true)))).unwrap();
        assert_same(&format!("{what} greedy"), &g, &greedy);
        assert_same(&format!("{what} sampled"), &s, &sampled);
    }

    // The CLI: same output at --nproc 2 as at one rank.
    let file = dir.path().join("prompts.txt");
    std::fs::write(&file, "1 2 3 4\n7\n9 8 7 6 5 4\n").unwrap();
    let cli = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_megatron"))
            .args(["generate", "--load"])
            .arg(&save)
            .arg("--prompts-file")
            .arg(&file)
            .args(["--tokens-to-generate", "6", "--temperature", "0.9", "--seed", "5", "--threads", "1"])
            .args(extra)
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), stdout.into_owned(), stderr.into_owned())
    };
    let (ok, want, err) = cli(&[]);
    assert!(ok && want.lines().count() == 3, "{want}\n{err}");
    for extra in
        [["--nproc", "2", "--tensor-model-parallel-size", "2"], ["--nproc", "2", "--pipeline-model-parallel-size", "2"]]
    {
        let (ok, got, err) = cli(&extra);
        assert!(ok, "{extra:?}: {err}");
        assert_eq!(got, want, "{extra:?}");
    }
    let (ok, _, err) = cli(&["--nproc", "4", "--tensor-model-parallel-size", "2"]);
    assert!(!ok && err.contains("--nproc 4 must equal"), "{err}");
}
