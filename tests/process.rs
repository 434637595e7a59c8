//! Process-level behaviour of the `megatron` binary: SIGTERM saves and exits cleanly; a
//! `kill -9` in the middle of a save leaves the previous checkpoint loadable; bad flags give
//! actionable errors.

mod common;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn megatron() -> Command {
    Command::new(env!("CARGO_BIN_EXE_megatron"))
}

fn base(extra: &str) -> Vec<String> {
    let mut v = vec!["pretrain".to_string()];
    v.extend(common::tiny_with(extra));
    v
}

fn tracker(dir: &Path) -> Option<u64> {
    std::fs::read_to_string(dir.join("latest_checkpointed_iteration.txt")).ok()?.trim().parse().ok()
}

#[test]
fn sigterm_saves_a_checkpoint_and_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().join("ckpt");
    let args =
        base(&format!("--train-iters 1000000 --log-interval 1 --save {} --save-interval 1000000", save.display()));
    let mut child = megatron().args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    // Wait for the third logged iteration, then signal.
    let mut seen = 0;
    for line in lines.by_ref() {
        if line.unwrap().contains(" iteration ") {
            seen += 1;
            if seen == 3 {
                break;
            }
        }
    }
    assert_eq!(seen, 3, "training did not log iterations");
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "exit status {status:?}; output tail: {:?}",
        rest.iter().rev().take(5).collect::<Vec<_>>()
    );
    assert!(rest.iter().any(|l| l.contains("because of a signal")), "no exit message in {rest:?}");
    let it = tracker(&save).expect("a checkpoint was saved on SIGTERM");
    assert!(it >= 3);
    assert!(save.join(format!("iter_{it:07}")).is_dir());
}

#[test]
fn kill_9_during_a_save_leaves_the_previous_checkpoint_loadable() {
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().join("ckpt");
    // A wide vocabulary makes each save large enough (tens of MB) to be caught mid-way.
    let model = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2 \
                 --global-batch-size 2 --lr 1e-3 --mock-data --vocab-size 60000 --log-interval 1 --eval-iters 0";
    let args = format!("pretrain {model} --train-iters 1000000 --save {} --save-interval 1", save.display());
    let mut child =
        megatron().args(args.split_whitespace()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut killed_mid_save = false;
    while Instant::now() < deadline {
        // Wait until one checkpoint is complete and the next save is in progress.
        let in_progress = std::fs::read_dir(&save)
            .map(|rd| rd.filter_map(Result::ok).any(|e| e.file_name().to_string_lossy().ends_with(".tmp")))
            .unwrap_or(false);
        if in_progress && tracker(&save).is_some() {
            child.kill().unwrap(); // SIGKILL
            killed_mid_save = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let _ = child.wait();
    assert!(killed_mid_save, "never observed a save in progress");
    let it = tracker(&save).expect("tracker survives");
    // The tracker names a complete checkpoint: resuming from it trains one more iteration.
    let out = megatron()
        .args(
            format!(
                "pretrain {model} --train-iters {} --load {} --override-opt_param-scheduler",
                it + 1,
                save.display()
            )
            .split_whitespace(),
        )
        .output()
        .unwrap();
    assert!(out.status.success(), "resume after kill -9 failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("iteration {:8}/", it + 1)));
}

#[test]
fn bad_flags_name_the_problem() {
    let out = megatron().args(base("--train-iters 5 --global-batch-size 3")).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--global-batch-size 3"), "{err}");

    let out = megatron()
        .args([
            "pretrain",
            "--num-layers",
            "2",
            "--hidden-size",
            "30",
            "--num-attention-heads",
            "4",
            "--seq-length",
            "8",
        ])
        .args(["--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("divisible by --num-attention-heads"), "{err}");
    assert!(err.contains("--vocab-size"), "all problems are reported at once: {err}");
}

#[test]
fn loss_scale_flags_are_checked() {
    let out = megatron().args(base("--train-iters 5 --fp16 --min-loss-scale 1e10")).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--min-loss-scale (10000000000) is larger than --initial-loss-scale"), "{err}");
    let out = megatron().args(base("--train-iters 5 --fp16 --grad-reduce-in-bf16")).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--grad-reduce-in-bf16 applies to --bf16"), "{err}");
    let out = megatron().args(base("--train-iters 5 --bf16 --loss-scale 0")).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--loss-scale must be a finite number > 0"), "{err}");
}

#[test]
fn recompute_flags_are_checked() {
    let out = megatron().args(base("--train-iters 5 --recompute-granularity full")).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("needs --recompute-method uniform or block"), "{err}");
    let out = megatron()
        .args(base("--train-iters 5 --recompute-granularity selective --recompute-modules mlp"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("only core_attn is available"), "{err}");
    let out = megatron().args(base("--train-iters 5 --recompute-method block")).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("need --recompute-granularity"), "{err}");
}

#[test]
fn missing_data_prefix_is_reported_with_its_path() {
    let out = megatron()
        .args(base("--train-iters 1").iter().filter(|a| *a != "--mock-data"))
        .args(["--data-path", "/nonexistent/corpus_text_document", "--tokenizer-type", "NullTokenizer"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/corpus_text_document"), "{err}");
}

#[test]
fn list_prints_the_registered_plugins() {
    let out = megatron().arg("list").output().unwrap();
    assert!(out.status.success());
    let s = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "backend",
        "cpu",
        "model",
        "gpt",
        "optimizer",
        "adam",
        "lr-schedule",
        "dataset",
        "mock",
        "tokenizer",
        "GPT2BPETokenizer",
        "metrics",
        "tensorboard",
    ] {
        assert!(s.contains(needle), "`megatron list` lacks {needle}:\n{s}");
    }
}
