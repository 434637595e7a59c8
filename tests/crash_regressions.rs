//! Regression tests of issue 10's "crashes and silent wrong answers": each runs the real
//! binary (so a panic, an allocation abort or a signal is a failed test, not a dead test
//! harness) and checks the clean error that replaced the crash. Commands that allocated
//! without bound on the old code run under `ulimit -v`, so a regression fails fast instead of
//! pushing the machine into swap.

mod common;
use std::path::Path;
use std::process::{Command, Output};

/// Address-space limit (KiB) for commands that once allocated without bound.
const VMEM_LIMIT_KIB: u64 = 6 * 1024 * 1024;

fn megatron_limited(args: &[&str]) -> Output {
    let script = format!("ulimit -v {VMEM_LIMIT_KIB}; exec \"$0\" \"$@\"");
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_megatron"))
        .args(args)
        .output()
        .expect("running megatron")
}

/// Exit code 1 with `needle` in stderr: an error, not a panic (101) or a signal (None).
fn assert_clean_error(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "expected a clean error exit; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains(needle), "stderr lacks {needle:?}: {stderr}");
}

fn tiny_pretrain(extra: &str) -> Vec<String> {
    let mut v = vec!["pretrain".to_string()];
    v.extend(common::tiny_with(extra));
    v
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn make_vocab_size_divisible_by_zero_is_an_error_not_a_division_by_zero() {
    let args = tiny_pretrain("--train-iters 1 --make-vocab-size-divisible-by 0");
    assert_clean_error(&megatron_limited(&strs(&args)), "--make-vocab-size-divisible-by must be >= 1");
}

#[test]
fn repeated_flags_keep_the_last_value_and_negative_values_reach_the_range_check() {
    // argparse keeps the last of a repeated flag; clap used to reject the repetition.
    let args = tiny_pretrain("--train-iters 1 --lr 1e-3");
    let mut argv = strs(&args);
    argv.extend(["--lr", "-1"]);
    assert_clean_error(&megatron_limited(&argv), "--lr must be >= 0");
    // ... and the last value wins in the other direction too.
    let args = tiny_pretrain("--train-iters 1 --lr -1");
    let mut argv = strs(&args);
    argv.extend(["--lr", "1e-3", "--hidden-dropout", "0.0", "--hidden-dropout", "-0.5"]);
    assert_clean_error(&megatron_limited(&argv), "--hidden-dropout and --attention-dropout must be in [0, 1)");
}

#[test]
fn tokenizer_train_rejects_a_huge_vocab_before_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("a.txt");
    std::fs::write(&input, "hello world\n").unwrap();
    let out = dir.path().join("tok");
    let args = ["tokenizer", "train", "--input", input.to_str().unwrap(), "--vocab-size", "4000000000"];
    let mut argv = args.to_vec();
    argv.extend(["--output-dir", out.to_str().unwrap()]);
    assert_clean_error(&megatron_limited(&argv), "--vocab-size 4000000000 is too large");
    assert!(!Path::new(&out).join("vocab.json").exists());
}

/// A tiny checkpoint saved by the binary, in `dir/ckpt`; returns its iteration directory.
fn tiny_checkpoint(dir: &Path) -> std::path::PathBuf {
    let save = dir.join("ckpt");
    let args =
        tiny_pretrain(&format!("--train-iters 4 --lr-warmup-iters 1 --save {} --save-interval 4", save.display()));
    let out = megatron_limited(&strs(&args));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    save.join("iter_0000004")
}

#[test]
fn checkpoint_metadata_claiming_a_huge_model_is_rejected_before_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let iter_dir = tiny_checkpoint(dir.path());
    let meta_path = iter_dir.join("metadata.json");
    let good = std::fs::read_to_string(&meta_path).unwrap();
    let ckpt = dir.path().join("ckpt");
    let ckpt = ckpt.to_str().unwrap();
    let cases = [
        ("num_layers", 100_000u64, "args say num_layers 100000, but the checkpoint stores 2 decoder layers"),
        ("hidden_size", 1 << 20, "hidden_size 1048576"),
        ("max_position_embeddings", 1 << 30, "max_position_embeddings 1073741824"),
        ("ffn_hidden_size", 1 << 30, "ffn_hidden_size 1073741824"),
    ];
    for (key, value, needle) in cases {
        let mut meta: serde_json::Value = serde_json::from_str(&good).unwrap();
        meta["args"][key] = value.into();
        std::fs::write(&meta_path, meta.to_string()).unwrap();
        let out = megatron_limited(&["generate", "--load", ckpt, "--prompt", "1 2 3", "--tokens-to-generate", "2"]);
        assert_clean_error(&out, needle);
        let export = dir.path().join(format!("hf-{key}"));
        let out = megatron_limited(&["export", "hf", "--load", ckpt, "--out", export.to_str().unwrap()]);
        assert_clean_error(&out, needle);
    }
    // The untouched checkpoint still generates.
    std::fs::write(&meta_path, &good).unwrap();
    let out = megatron_limited(&["generate", "--load", ckpt, "--prompt", "1 2 3", "--tokens-to-generate", "2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn runs_that_cannot_fit_are_refused_with_the_estimate_before_allocating() {
    // The address-space limit of `megatron_limited` is one of the limits the check reads.
    for extra in [
        "--train-iters 1 --num-layers 100000",
        "--train-iters 1 --seq-length 1000000 --max-position-embeddings 1000000",
    ] {
        let args = tiny_pretrain(extra);
        let out = megatron_limited(&strs(&args));
        assert_clean_error(&out, "this run needs about");
        assert_clean_error(&out, "--skip-memory-check");
    }
    // A run that fits reports its estimate and trains; the override flag is accepted.
    let args = tiny_pretrain("--train-iters 1 --lr-warmup-iters 0 --skip-memory-check");
    let out = megatron_limited(&strs(&args));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("memory estimate"));
}

/// The system's libm (any real shared object), if this machine has one where we look.
fn system_libm() -> Option<&'static str> {
    ["/lib/x86_64-linux-gnu/libm.so.6", "/lib64/libm.so.6", "/usr/lib/libm.so.6", "/lib/aarch64-linux-gnu/libm.so.6"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
}

#[test]
fn plugin_paths_are_the_files_loaded_and_truncated_libraries_are_errors_not_sigbus() {
    let dir = tempfile::tempdir().unwrap();
    // `./libm.so.6` is what the user named and what gets checked; dlopen of the bare name would
    // load the system libm instead.
    std::fs::write(dir.path().join("libm.so.6"), "this is not a library, and not the system libm either").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_megatron"))
        .args(["--plugin", "libm.so.6", "list"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_clean_error(&out, "not an ELF shared library");
    let real = std::fs::canonicalize(dir.path().join("libm.so.6")).unwrap();
    assert_clean_error(&out, &real.display().to_string());

    let Some(libm) = system_libm() else {
        eprintln!("SKIP: no system libm.so.6 to truncate");
        return;
    };
    let bytes = std::fs::read(libm).unwrap();
    for tenths in [3, 6, 9] {
        let cut = dir.path().join(format!("libcut{tenths}.so"));
        std::fs::write(&cut, &bytes[..bytes.len() * tenths / 10]).unwrap();
        let out = megatron_limited(&["--plugin", cut.to_str().unwrap(), "list"]);
        assert_clean_error(&out, "is truncated or corrupted");
    }
}
