//! `--num-experts` end to end through the `megatron` binary: without the MoE plugin it is an
//! error that says how to get it; with `--plugin libmegatron_moe.so` (built here as a debug
//! cdylib, `cargo build -p megatron-moe`) a tiny GPT trains with MoE MLPs and the log line
//! carries the load-balancing loss, the z-loss and the per-layer expert load.

use std::path::PathBuf;
use std::process::Command;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

const ITERS: &[&str] = &["--train-iters", "10", "--log-interval", "5"];
const TINY: &[&str] = &[
    "pretrain",
    "--num-layers",
    "2",
    "--hidden-size",
    "32",
    "--num-attention-heads",
    "4",
    "--seq-length",
    "16",
    "--micro-batch-size",
    "4",
    "--global-batch-size",
    "8",
    "--lr",
    "1e-2",
    "--mock-data",
    "--vocab-size",
    "64",
    "--eval-iters",
    "0",
    "--num-experts",
    "4",
    "--moe-router-topk",
    "2",
    "--moe-aux-loss-coeff",
    "1e-2",
    "--moe-z-loss-coeff",
    "1e-3",
    "--moe-layer-freq",
    "([1]*1+[0]*1)*1",
];

/// Builds the debug cdylib and returns its path.
fn plugin_library() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo).current_dir(workspace()).args(["build", "-q", "-p", "megatron-moe"]).status();
    assert!(status.is_ok_and(|s| s.success()), "cargo build -p megatron-moe failed");
    let target = std::env::var("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|_| workspace().join("target"));
    target.join("debug").join("libmegatron_moe.so")
}

#[test]
fn num_experts_without_the_plugin_says_how_to_get_it() {
    if cfg!(feature = "moe") {
        eprintln!("skipped: this build links the moe plugin (feature `moe`)");
        return;
    }
    let out =
        Command::new(env!("CARGO_BIN_EXE_megatron")).current_dir(workspace()).args(TINY).args(ITERS).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--plugin") && err.contains("libmegatron_moe.so") && err.contains("--features moe"), "{err}");
}

#[test]
fn the_plugin_library_trains_moe_layers_and_logs_their_losses() {
    if cfg!(feature = "moe") {
        eprintln!("skipped: this build links the moe plugin (feature `moe`), a library would clash");
        return;
    }
    let lib = plugin_library();
    let out = Command::new(env!("CARGO_BIN_EXE_megatron"))
        .current_dir(workspace())
        .arg("--plugin")
        .arg(&lib)
        .args(TINY)
        .args(ITERS)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().filter(|l| l.contains("iteration") && l.contains("lm loss")).collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    for l in &lines {
        for field in ["load_balancing_loss:", "z_loss:", "expert_load_imbalance/layer0:", "expert_load_max/layer0:"] {
            assert!(l.contains(field), "missing `{field}` in {l}");
        }
        // Layer 1 is dense (`--moe-layer-freq` pattern [1, 0]).
        assert!(!l.contains("layer1"), "{l}");
    }
}

/// The lm loss and grad norm fields of every log line.
fn losses(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|l| {
            let i = l.find("lm loss:")?;
            let j = l.find("| number of skipped")?;
            Some(l[i..j].to_string())
        })
        .collect()
}

#[test]
fn moe_losses_are_the_same_under_tp_pp_and_dp() {
    if cfg!(feature = "moe") {
        eprintln!("skipped: this build links the moe plugin (feature `moe`), a library would clash");
        return;
    }
    let lib = plugin_library();
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_megatron"))
            .current_dir(workspace())
            .arg("--plugin")
            .arg(&lib)
            .args(TINY)
            .args(["--hidden-dropout", "0", "--attention-dropout", "0", "--train-iters", "6", "--log-interval", "2"])
            .args(extra)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "{extra:?}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        losses(&stdout)
    };
    let single = run(&[]);
    assert_eq!(single.len(), 3, "{single:?}");
    for layout in [
        &["--nproc", "2", "--pipeline-model-parallel-size", "2"][..],
        &["--nproc", "2"],
        &["--nproc", "4", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"],
    ] {
        assert_eq!(run(layout), single, "{layout:?}");
    }
}
