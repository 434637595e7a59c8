//! Computes the build tag of this megatron-core build (`MEGATRON_BUILD_TAG`), which a host and a
//! dynamically loaded plugin library compare before any Rust type crosses between them.
//!
//! The tag holds what decides whether the two sides agree on the layout of every shared type:
//! the megatron-core version, the exact rustc (`$RUSTC -V`), the target triple, the panic
//! strategy, the enabled core features, and a hash of the `Cargo.lock` entries of
//! megatron-core's dependency closure (serde, erased-serde, anyhow, ... versions), and a hash of
//! megatron-core's own sources (`api`): a method added to a shared trait such as `MlpModule`
//! changes the vtables without changing the version, and must still refuse the library.
//!
//! Which `Cargo.lock`: the one of the workspace being built. It is found, in order, from the
//! `MEGATRON_CARGO_LOCK` environment variable, the ancestors of `OUT_DIR` (the target dir
//! normally sits in the consuming workspace, so this is right for the megatron workspace and
//! for an out-of-tree plugin workspace alike), then the ancestors of this crate's directory.
//! Only megatron-core's closure is hashed, so an out-of-tree plugin whose own lock file has
//! extra packages still matches the host when the shared ones resolve to the same versions.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=MEGATRON_CARGO_LOCK");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc_version = Command::new(&rustc)
        .arg("-V")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown-rustc".into());
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown-target".into());
    let panic = std::env::var("CARGO_CFG_PANIC").unwrap_or_else(|_| "unwind".into());
    let mut features: Vec<String> = std::env::vars()
        .filter_map(|(k, _)| k.strip_prefix("CARGO_FEATURE_").map(|f| f.to_lowercase().replace('_', "-")))
        .collect();
    features.sort();
    let lock = match find_lock() {
        Some(path) => {
            println!("cargo:rerun-if-changed={}", path.display());
            std::fs::read_to_string(&path).ok().and_then(|text| closure_hash(&text, "megatron-core"))
        }
        None => None,
    }
    .unwrap_or_else(|| "unknown".into());
    println!("cargo:rerun-if-changed=src");
    let api = source_hash().unwrap_or_else(|| "unknown".into());
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let tag = format!(
        "megatron-core={version};rustc={rustc_version};target={target};panic={panic};features={};api={api};lock={lock}",
        features.join(",")
    );
    println!("cargo:rustc-env=MEGATRON_BUILD_TAG={tag}");
}

/// The `Cargo.lock` of the workspace being built (see the module doc for the order).
fn find_lock() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("MEGATRON_CARGO_LOCK") {
        return Some(PathBuf::from(p));
    }
    let from = |dir: Option<String>| {
        let dir = PathBuf::from(dir?);
        dir.ancestors().map(|d| d.join("Cargo.lock")).find(|p| p.is_file())
    };
    from(std::env::var("OUT_DIR").ok()).or_else(|| from(std::env::var("CARGO_MANIFEST_DIR").ok()))
}

/// FNV-1a 64 of the sorted `name version` lines of `root`'s dependency closure in a lock file.
fn closure_hash(lock: &str, root: &str) -> Option<String> {
    // name -> [(version, dependency references)]
    let mut packages: BTreeMap<String, Vec<(String, Vec<String>)>> = BTreeMap::new();
    for block in lock.split("[[package]]").skip(1) {
        let field =
            |key: &str| block.lines().find_map(|l| l.strip_prefix(key).map(|v| v.trim().trim_matches('"').to_string()));
        let (Some(name), Some(version)) = (field("name = "), field("version = ")) else { continue };
        let deps = match block.split_once("dependencies = [") {
            Some((_, rest)) => rest
                .split(']')
                .next()
                .unwrap_or("")
                .split(',')
                .map(|d| d.trim().trim_matches('"').to_string())
                .filter(|d| !d.is_empty())
                .collect(),
            None => Vec::new(),
        };
        packages.entry(name).or_default().push((version, deps));
    }
    let resolve = |reference: &str| -> Option<(String, usize)> {
        // A reference is `name`, `name version` or `name version (source)`.
        let mut parts = reference.split_whitespace();
        let name = parts.next()?.to_string();
        let candidates = packages.get(&name)?;
        let index = match parts.next() {
            Some(v) => candidates.iter().position(|(cv, _)| cv == v)?,
            None => 0,
        };
        Some((name, index))
    };
    let mut seen: BTreeSet<(String, usize)> = BTreeSet::new();
    let mut stack = vec![resolve(root)?];
    while let Some(node) = stack.pop() {
        if !seen.insert(node.clone()) {
            continue;
        }
        for d in &packages[&node.0][node.1].1 {
            if let Some(next) = resolve(d) {
                stack.push(next);
            }
        }
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for (name, index) in &seen {
        for b in format!("{name} {}\n", packages[name][*index].0).bytes() {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    Some(format!("{hash:016x}"))
}

/// FNV-1a 64 of every file under this crate's `src/` (relative path and bytes, in path order).
fn source_hash() -> Option<String> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").ok()?).join("src");
    let mut files = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).ok()? {
            let path = entry.ok()?.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for file in files {
        let rel = file.strip_prefix(&root).ok()?.to_string_lossy().into_owned();
        for b in rel.bytes().chain([0]).chain(std::fs::read(&file).ok()?) {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    Some(format!("{hash:016x}"))
}
