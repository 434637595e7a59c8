//! Names and durability on disk: `SAVE/iter_0000100/`, shard file names, the
//! `latest_checkpointed_iteration.txt` tracker, fsync helpers and crash leftovers.
//!
//! Crash-safety protocol (see `save.rs`): everything is written into `iter_N.tmp/`, fsynced,
//! then renamed to `iter_N/`; only after that is the tracker replaced (write to
//! `….txt.tmp`, fsync, rename). When `iter_N/` already exists it is first renamed to
//! `iter_N.replaced/` and deleted after the new one is in place, so a crash in between
//! leaves `iter_N.replaced/` complete — [`resolve_iteration_dir`] falls back to it.

use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

/// The tracker file naming the latest complete checkpoint.
pub const TRACKER_FILE: &str = "latest_checkpointed_iteration.txt";
const TMP_SUFFIX: &str = ".tmp";
const REPLACED_SUFFIX: &str = ".replaced";

/// `iter_0000100` (Megatron's 7-digit zero padding).
pub fn iteration_dir_name(iteration: u64) -> String {
    format!("iter_{iteration:07}")
}

pub fn iteration_dir(dir: &Path, iteration: u64) -> PathBuf {
    dir.join(iteration_dir_name(iteration))
}

pub(crate) fn tmp_dir(dir: &Path, iteration: u64) -> PathBuf {
    dir.join(format!("{}{TMP_SUFFIX}", iteration_dir_name(iteration)))
}

pub(crate) fn replaced_dir(dir: &Path, iteration: u64) -> PathBuf {
    dir.join(format!("{}{REPLACED_SUFFIX}", iteration_dir_name(iteration)))
}

/// Safetensors file of one model-parallel rank: `model_tp{tp:02}_pp{pp:03}.safetensors`.
pub fn shard_file_name(tp_rank: usize, pp_rank: usize) -> String {
    format!("model_tp{tp_rank:02}_pp{pp_rank:03}.safetensors")
}

/// The directory holding a complete checkpoint of `iteration`: `iter_N/`, or `iter_N.replaced/`
/// when a crash interrupted the re-save of the same iteration.
pub fn resolve_iteration_dir(dir: &Path, iteration: u64) -> Result<PathBuf> {
    for candidate in [iteration_dir(dir, iteration), replaced_dir(dir, iteration)] {
        if candidate.is_dir() {
            return Ok(candidate);
        }
    }
    let found = list_iterations(dir).unwrap_or_default();
    bail!(
        "checkpoint directory {} does not exist (complete checkpoints in {}: {}); pass an existing \
         iteration with --ckpt-step or fix {}",
        iteration_dir(dir, iteration).display(),
        dir.display(),
        if found.is_empty() { "none".to_string() } else { format!("{found:?}") },
        dir.join(TRACKER_FILE).display()
    )
}

/// Iterations with a complete `iter_N/` directory in `dir`, ascending.
pub fn list_iterations(dir: &Path) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    for entry in
        std::fs::read_dir(dir).with_context(|| format!("cannot list checkpoint directory {}", dir.display()))?
    {
        let name = entry?.file_name();
        if let Some(n) = name.to_str().and_then(|n| n.strip_prefix("iter_")).and_then(|n| n.parse().ok()) {
            out.push(n);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The iteration named by `dir/latest_checkpointed_iteration.txt`; `None` when the file is
/// missing (nothing saved yet). Any other content is an error naming the file and content.
pub fn read_tracker(dir: &Path) -> Result<Option<u64>> {
    let path = dir.join(TRACKER_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read checkpoint tracker {}", path.display())),
    };
    let content = text.trim();
    if content == "release" {
        bail!(
            "{} says `release`: release checkpoints are a Megatron-LM torch-format feature that \
             megatron-rs does not write; convert the checkpoint or point --load elsewhere",
            path.display()
        );
    }
    content.parse::<u64>().map(Some).map_err(|_| {
        anyhow::anyhow!(
            "checkpoint tracker {} holds `{}`, not an iteration number: write the latest complete \
             iteration (e.g. `100`) into it or delete it",
            path.display(),
            content.chars().take(80).collect::<String>()
        )
    })
}

/// Atomically points the tracker at `iteration` (tmp file, fsync, rename, fsync of `dir`).
pub fn write_tracker(dir: &Path, iteration: u64) -> Result<()> {
    let path = dir.join(TRACKER_FILE);
    let tmp = dir.join(format!("{TRACKER_FILE}{TMP_SUFFIX}"));
    write_file_synced(&tmp, iteration.to_string().as_bytes())?;
    std::fs::rename(&tmp, &path).with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))?;
    sync_dir(dir)
}

/// Writes `bytes` to a new file and fsyncs it.
pub(crate) fn write_file_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(bytes).with_context(|| format!("cannot write {}", path.display()))?;
    f.sync_all().with_context(|| format!("cannot fsync {}", path.display()))
}

/// Fsyncs a file written by someone else (the safetensors serializer).
pub(crate) fn sync_file(path: &Path) -> Result<()> {
    File::open(path).and_then(|f| f.sync_all()).with_context(|| format!("cannot fsync {}", path.display()))
}

/// Fsyncs a directory so renames and new entries in it are durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|f| f.sync_all()).with_context(|| format!("cannot fsync directory {}", dir.display()))
}

/// Removes crash leftovers: every `iter_*.tmp/` (never named by the tracker), the tracker's
/// tmp file, and `iter_N.replaced/` once `iter_N/` exists again.
pub(crate) fn clean_stale(dir: &Path) -> Result<()> {
    for entry in
        std::fs::read_dir(dir).with_context(|| format!("cannot list checkpoint directory {}", dir.display()))?
    {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let path = entry.path();
        let tmp_leftover =
            name == format!("{TRACKER_FILE}{TMP_SUFFIX}") || (name.starts_with("iter_") && name.ends_with(TMP_SUFFIX));
        let superseded = name
            .strip_suffix(REPLACED_SUFFIX)
            .filter(|b| b.starts_with("iter_"))
            .is_some_and(|base| dir.join(base).is_dir());
        if tmp_leftover || superseded {
            let removed = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
            removed.with_context(|| format!("cannot remove stale checkpoint leftover {}", path.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(iteration_dir_name(100), "iter_0000100");
        assert_eq!(shard_file_name(1, 2), "model_tp01_pp002.safetensors");
    }

    #[test]
    fn tracker_round_trip_missing_and_garbage() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(read_tracker(tmp.path()).unwrap(), None);
        write_tracker(tmp.path(), 1234).unwrap();
        assert_eq!(read_tracker(tmp.path()).unwrap(), Some(1234));
        assert!(!tmp.path().join("latest_checkpointed_iteration.txt.tmp").exists());
        // Megatron writes a trailing newline sometimes; whitespace is fine.
        std::fs::write(tmp.path().join(TRACKER_FILE), "77\n").unwrap();
        assert_eq!(read_tracker(tmp.path()).unwrap(), Some(77));
        std::fs::write(tmp.path().join(TRACKER_FILE), "seventy").unwrap();
        let err = read_tracker(tmp.path()).unwrap_err().to_string();
        assert!(err.contains(TRACKER_FILE) && err.contains("`seventy`"), "{err}");
        std::fs::write(tmp.path().join(TRACKER_FILE), "release").unwrap();
        assert!(read_tracker(tmp.path()).unwrap_err().to_string().contains("release"));
    }

    #[test]
    fn stale_cleanup_keeps_what_may_be_needed() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        for sub in ["iter_0000100", "iter_0000200.tmp", "iter_0000100.replaced", "iter_0000300.replaced"] {
            std::fs::create_dir(d.join(sub)).unwrap();
        }
        std::fs::write(d.join("latest_checkpointed_iteration.txt.tmp"), "1").unwrap();
        clean_stale(d).unwrap();
        assert!(d.join("iter_0000100").is_dir());
        assert!(!d.join("iter_0000200.tmp").exists());
        assert!(!d.join("iter_0000100.replaced").exists(), "iter_0000100 exists, so the old copy goes");
        assert!(d.join("iter_0000300.replaced").is_dir(), "only complete copy of 300: kept");
        assert!(!d.join("latest_checkpointed_iteration.txt.tmp").exists());
        assert_eq!(resolve_iteration_dir(d, 300).unwrap(), d.join("iter_0000300.replaced"));
        assert_eq!(list_iterations(d).unwrap(), vec![100]);
        let err = resolve_iteration_dir(d, 400).unwrap_err().to_string();
        assert!(err.contains("iter_0000400") && err.contains("[100]"), "{err}");
    }
}
