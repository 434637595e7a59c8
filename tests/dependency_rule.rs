//! ARCHITECTURE.md's dependency rule, read from `cargo metadata`: `core` depends on no
//! workspace crate; kernels, tokenizers, datasets and plugins depend on `core` only (a
//! dev-dependency on a backend for tests is allowed); models depend on `core` and
//! `models/transformer`; the serving engine under the CLI may use the GPT model; only the
//! `megatron` package depends on everything.

use serde_json::Value;
use std::process::Command;

#[test]
fn workspace_crates_follow_the_dependency_rule() {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = meta["packages"].as_array().unwrap();
    let members: Vec<String> = packages.iter().map(|p| p["name"].as_str().unwrap().to_string()).collect();
    assert!(members.len() >= 11, "{members:?}");
    for p in packages {
        let name = p["name"].as_str().unwrap();
        let deps: Vec<&str> = p["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["kind"].is_null()) // normal dependencies only
            .map(|d| d["name"].as_str().unwrap())
            .filter(|d| members.iter().any(|m| m == d))
            .collect();
        let allowed: &[&str] = match name {
            "megatron" => continue,
            "megatron-core" => &[],
            "megatron-gpt" => &["megatron-core", "megatron-transformer"],
            "megatron-bert" => &["megatron-core", "megatron-transformer"],
            "megatron-t5" => &["megatron-core", "megatron-transformer"],
            "megatron-hybrid" => &["megatron-core", "megatron-transformer"],
            // The serving engine sits under the CLI (src/ stays thin) and drives the GPT's slotted
            // KV cache the way the CLI would; no model depends on it.
            "megatron-serving" => &["megatron-core", "megatron-gpt"],
            // Reason written in its Cargo.toml: it reduces with the `local` communicator's
            // arithmetic so MPI runs are bit-identical to --nproc runs.
            "megatron-comm-mpi" => &["megatron-core", "megatron-comm-local"],
            _ => &["megatron-core"],
        };
        for d in deps {
            assert!(
                allowed.contains(&d),
                "`{name}` depends on `{d}`, which the dependency rule forbids (allowed: {allowed:?})"
            );
        }
    }
}
