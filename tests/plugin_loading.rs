//! Dynamic plugins end to end, with the commands of docs/plugins.md: build the example plugin
//! crate as a cdylib (`cargo build -p megatron-example-mlp-lm`), then run the `megatron`
//! binary with `--plugin` to list it, train it, and show the refusals (forged build tag,
//! missing file, library without the entry symbols, name clash) and the panic guard. Also
//! `pretrain --config FILE` in JSON, TOML and YAML.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

const CRATE: &str = "megatron-example-mlp-lm";
const LIB_FILE: &str = "libmegatron_example_mlp_lm.so";

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `cargo build -p megatron-example-mlp-lm [extra]`, returning the cdylib copied to `dest`.
fn build_plugin(extra: &[&str], dest: &Path) -> anyhow::Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status =
        Command::new(cargo).current_dir(workspace()).args(["build", "-q", "-p", CRATE]).args(extra).status()?;
    anyhow::ensure!(status.success(), "cargo build -p {CRATE} {extra:?} failed");
    let target = std::env::var("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|_| workspace().join("target"));
    let built = target.join("debug").join(LIB_FILE);
    std::fs::copy(&built, dest)?;
    Ok(dest.to_path_buf())
}

struct Libraries {
    _dir: tempfile::TempDir,
    good: PathBuf,
    forged: PathBuf,
}

/// Both variants, built once per test process (the forged one first, so the normal build is
/// what stays in target/debug).
fn libraries() -> &'static Libraries {
    static LIBS: OnceLock<Libraries> = OnceLock::new();
    LIBS.get_or_init(|| {
        let build = || -> anyhow::Result<Libraries> {
            let dir = tempfile::tempdir()?;
            // Same file name in another folder: the refusal's rebuild command names the crate.
            std::fs::create_dir(dir.path().join("forged"))?;
            let forged = build_plugin(&["--features", "forge-tag"], &dir.path().join("forged").join(LIB_FILE))?;
            let good = build_plugin(&[], &dir.path().join(LIB_FILE))?;
            Ok(Libraries { _dir: dir, good, forged })
        };
        match build() {
            Ok(libs) => libs,
            Err(e) => panic!("building the example plugin failed: {e:#}"),
        }
    })
}

fn megatron(args: &[&str]) -> anyhow::Result<Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_megatron")).current_dir(workspace()).args(args).output()?)
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

const TRAIN: &str = "pretrain --model swiglu-mlp-lm --num-layers 2 --hidden-size 32 --num-attention-heads 4 \
    --seq-length 16 --micro-batch-size 4 --global-batch-size 8 --lr 1e-2 --mock-data --vocab-size 64 \
    --train-iters 20 --log-interval 5 --eval-interval 100 --eval-iters 1 --threads 1";

#[test]
fn list_shows_the_plugin_with_its_library_path() -> anyhow::Result<()> {
    if example_linked_in() {
        return Ok(());
    }
    let lib = libraries().good.to_string_lossy().into_owned();
    let out = megatron(&["--plugin", &lib, "list", "--kind", "model"])?;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let row = stdout.lines().find(|l| l.starts_with("model") && l.contains("swiglu-mlp-lm"));
    let row: Vec<&str> = row.map(|r| r.split_whitespace().collect()).unwrap_or_default();
    assert_eq!(row, ["model", "swiglu-mlp-lm", env!("CARGO_PKG_VERSION"), CRATE, lib.as_str()], "{stdout}");
    Ok(())
}

#[test]
fn the_plugin_model_trains_and_its_loss_goes_down() -> anyhow::Result<()> {
    if example_linked_in() {
        return Ok(());
    }
    let lib = libraries().good.to_string_lossy().into_owned();
    let mut args = vec!["--plugin", lib.as_str()];
    args.extend(TRAIN.split_whitespace());
    let out = megatron(&args)?;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}\n{stdout}");
    let losses: Vec<f64> = stdout
        .lines()
        .filter(|l| l.contains(" iteration "))
        .filter_map(|l| l.split("lm loss:").nth(1)?.split('|').next()?.trim().parse().ok())
        .collect();
    assert_eq!(losses.len(), 4, "{stdout}");
    assert!(losses[3] < 0.7 * losses[0], "loss did not go down: {losses:?}");
    Ok(())
}

#[test]
fn a_library_with_a_forged_build_tag_is_refused() -> anyhow::Result<()> {
    let lib = libraries().forged.to_string_lossy().into_owned();
    let out = megatron(&["--plugin", &lib, "list"])?;
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for needle in [
        "different megatron-core build",
        "differs in: megatron-core",
        "library tag: megatron-core=0.0.0-forged;",
        &format!("host tag:    megatron-core={};", env!("CARGO_PKG_VERSION")),
        "cargo build --release -p megatron-example-mlp-lm",
    ] {
        assert!(stderr.contains(needle), "missing `{needle}` in: {stderr}");
    }
    Ok(())
}

#[test]
fn missing_files_foreign_libraries_and_name_clashes_are_clear_errors() -> anyhow::Result<()> {
    let out = megatron(&["--plugin", "no/such/libplugin.so", "list"])?;
    assert!(text(&out).1.contains("plugin library `no/such/libplugin.so` does not exist"), "{}", text(&out).1);

    // A shared library that is not a megatron plugin (libc), or failing that a non-library.
    let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/lib64/libc.so.6", "/usr/lib/libc.so.6", "/lib/libc.so.6"]
        .into_iter()
        .find(|p| Path::new(p).is_file());
    if let Some(libc) = libc {
        let stderr = text(&megatron(&["--plugin", libc, "list"])?).1;
        assert!(
            stderr.contains("is not a megatron plugin library") && stderr.contains("megatron_plugin_build_tag"),
            "{stderr}"
        );
    }
    let dir = tempfile::tempdir()?;
    let fake = dir.path().join("libfake.so");
    std::fs::write(&fake, "not an ELF file")?;
    let stderr = text(&megatron(&["--plugin", &fake.to_string_lossy(), "list"])?).1;
    assert!(stderr.contains("not an ELF shared library"), "{stderr}");

    // The same plugin name twice: once from each load (or built in when the host links the crate).
    let lib = libraries().good.to_string_lossy().into_owned();
    let out = megatron(&["--plugin", &lib, "--plugin", &lib, "list"])?;
    let stderr = text(&out).1;
    assert!(!out.status.success());
    assert!(stderr.contains("duplicate model plugin `swiglu-mlp-lm`"), "{stderr}");
    let first = if cfg!(feature = "example-mlp-lm") { "(built-in)".to_string() } else { format!("({lib})") };
    assert!(stderr.contains(&format!("crate `{CRATE}` {first} and by crate `{CRATE}` ({lib})")), "{stderr}");
    Ok(())
}

#[test]
fn a_panic_in_plugin_code_is_an_error_naming_the_plugin() -> anyhow::Result<()> {
    if example_linked_in() {
        return Ok(());
    }
    let lib = libraries().good.to_string_lossy().into_owned();
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("panic.yaml");
    std::fs::write(&config, "model:\n  name: swiglu-mlp-lm\n  panic_in_forward: true\n")?;
    let config = config.to_string_lossy().into_owned();
    let mut args = vec!["--plugin", lib.as_str()];
    args.extend(TRAIN.split_whitespace());
    args.extend(["--config", config.as_str()]);
    let out = megatron(&args)?;
    let stderr = text(&out).1;
    // Exit code 1 (an error), not an abort.
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("plugin model `swiglu-mlp-lm` from `{lib}` panicked in forward")), "{stderr}");
    assert!(stderr.contains("panic_in_forward is set"), "{stderr}");
    Ok(())
}

// ---- --config FILE (built-in GPT, in process) ---------------------------------------------

/// The whole error chain of a run that must fail.
/// With the example linked in as a built-in (feature `example-mlp-lm`), loading its library
/// again is a name clash by design; only the clash test below runs then.
fn example_linked_in() -> bool {
    if cfg!(feature = "example-mlp-lm") {
        println!("skipping: the example plugin is linked in (feature example-mlp-lm), so loading its library clashes");
    }
    cfg!(feature = "example-mlp-lm")
}

fn err_text(result: anyhow::Result<f64>) -> String {
    match result {
        Ok(loss) => format!("unexpectedly trained (loss {loss})"),
        Err(e) => format!("{e:#}"),
    }
}

fn first_loss_with(file: Option<(&str, &str)>) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir()?;
    let mut flags =
        common::tiny_with("--train-iters 1 --lr-warmup-iters 0 --hidden-dropout 0 --attention-dropout 0 --threads 1");
    if let Some((name, content)) = file {
        let path = dir.path().join(name);
        std::fs::write(&path, content)?;
        flags.extend(["--config".to_string(), path.to_string_lossy().into_owned()]);
    }
    let summary = common::pretrain(&flags)?;
    summary.losses.first().map(|l| l.1).ok_or_else(|| anyhow::anyhow!("no loss logged"))
}

/// The same setting in the three formats: a large init std makes the first loss far above
/// ln(padded vocab) ≈ 4.85, where the default init (0.02) starts.
#[test]
fn config_files_in_json_toml_and_yaml_reach_the_plugins() -> anyhow::Result<()> {
    let base = first_loss_with(None)?;
    assert!((base - 128f64.ln()).abs() < 0.3, "default initial loss {base}");
    for (name, content) in [
        ("run.json", r#"{"model": {"name": "gpt", "init_method_std": 1.0}, "optimizer": {"beta2": 0.99}}"#),
        ("run.toml", "[model]\nname = \"gpt\"\ninit_method_std = 1.0\n\n[optimizer]\nbeta2 = 0.99\n"),
        ("run.yaml", "model:\n  name: gpt\n  init_method_std: 1.0\noptimizer: {beta2: 0.99}\n"),
    ] {
        let loss = first_loss_with(Some((name, content)))?;
        assert!(loss > base + 1.0, "{name}: initial loss {loss} vs default {base}");
    }
    Ok(())
}

#[test]
fn unknown_fields_and_sections_name_the_file_section_and_known_fields() -> anyhow::Result<()> {
    for (name, content) in [
        ("bad.json", r#"{"model": {"hidden_sise": 64}}"#),
        ("bad.toml", "[model]\nhidden_sise = 64\n"),
        ("bad.yml", "model:\n  hidden_sise: 64\n"),
    ] {
        let msg =
            format!("{:#}", first_loss_with(Some((name, content))).err().ok_or_else(|| anyhow::anyhow!("accepted"))?);
        for needle in ["unknown field `hidden_sise`", "expected one of", "hidden_size", "section `model`", name] {
            assert!(msg.contains(needle), "{name}: missing `{needle}` in: {msg}");
        }
    }
    let msg = err_text(first_loss_with(Some(("x.yaml", "modle: {}\n"))));
    assert!(msg.contains("unknown section `modle`") && msg.contains("model"), "{msg}");
    let msg = err_text(first_loss_with(Some(("x.ini", "[model]\n"))));
    assert!(msg.contains("unknown extension"), "{msg}");
    let msg = err_text(first_loss_with(Some(("x.yaml", "dataset: {name: gpt}\n"))));
    assert!(msg.contains("is for dataset plugin `gpt`, but this run builds `mock`"), "{msg}");
    Ok(())
}
