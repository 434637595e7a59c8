//! The on-disk index cache (SPEC §2.5): `{hash}-{Class}-{split}-{affix}` files in a cache
//! directory, the description text plus `.npy` arrays. Megatron lets global rank 0 build while
//! the others wait at a barrier; megatron-rs ranks may be threads or processes without a
//! barrier at this point, so the first to arrive builds under a lock file created with
//! `create_new`, and the others wait for the lock to go away and then read. Every file is
//! written atomically (temporary file, fsync, rename) and the description last, so a reader
//! never sees a partial set. A cache that fails validation is logged and rebuilt; a directory
//! that cannot be written falls back to building in memory with a warning.

use crate::npy::{read_npy, write_atomic, write_npy, NpyArray};
use anyhow::{anyhow, bail, Context};
use megatron_core::Result;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a waiter tolerates a lock held by a live process before giving up.
const LOCK_TIMEOUT: Duration = Duration::from_secs(3600);
const POLL: Duration = Duration::from_millis(20);

/// Where the arrays came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheStatus {
    /// Read from valid cache files.
    Hit,
    /// Built and written to the cache.
    Built,
    /// Built in memory only (no cache, or the cache directory is not writable).
    Uncached,
}

/// One cached item: `dir/{base}-description.txt` and `dir/{base}-{name}.npy` per array.
pub struct CacheEntry<'a> {
    pub dir: Option<&'a Path>,
    /// `{hash}-{Class}-{split}` (or `{hash}-{Class}` for classes without a split in the name).
    pub base: String,
    pub description: &'a str,
    /// Array names in order, e.g. `["document_index", "sample_index", "shuffle_index"]`.
    pub arrays: &'a [&'a str],
}

/// Whether `dir` holds the description file of the cache item named `base` (used to prefer
/// caches written under a legacy name when none exists under the current one).
pub fn has_description(dir: &Path, base: &str) -> bool {
    dir.join(format!("{base}-description.txt")).is_file()
}

/// Of a current and a legacy `(description, base)`, the one to use in `dir`: the legacy one only
/// when its files exist and the current one's do not.
pub fn pick_name<'a>(dir: &Path, current: (&'a str, String), legacy: Option<(&'a str, String)>) -> (&'a str, String) {
    match legacy {
        Some(old) if !has_description(dir, &current.1) && has_description(dir, &old.1) => old,
        _ => current,
    }
}

impl CacheEntry<'_> {
    pub fn description_path(&self, dir: &Path) -> PathBuf {
        dir.join(format!("{}-description.txt", self.base))
    }

    pub fn array_path(&self, dir: &Path, name: &str) -> PathBuf {
        dir.join(format!("{}-{name}.npy", self.base))
    }

    fn lock_path(&self, dir: &Path) -> PathBuf {
        dir.join(format!("{}.lock", self.base))
    }

    /// `Ok(None)` when a file is missing (a miss), `Err` when files exist but are invalid.
    fn try_load(&self, dir: &Path, validate: &dyn Fn(&[NpyArray]) -> Result<()>) -> Result<Option<Vec<NpyArray>>> {
        let desc_path = self.description_path(dir);
        let paths: Vec<PathBuf> = self.arrays.iter().map(|n| self.array_path(dir, n)).collect();
        if !desc_path.is_file() || !paths.iter().all(|p| p.is_file()) {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&desc_path).with_context(|| format!("reading `{}`", desc_path.display()))?;
        if text != self.description {
            bail!("`{}` describes a different dataset (stale or corrupt)", desc_path.display());
        }
        let arrays = paths.iter().map(|p| read_npy(p)).collect::<Result<Vec<_>>>()?;
        validate(&arrays).with_context(|| format!("validating the cached arrays `{}-*.npy`", self.base))?;
        Ok(Some(arrays))
    }

    fn write(&self, dir: &Path, arrays: &[NpyArray]) -> Result<()> {
        for (name, array) in self.arrays.iter().zip(arrays) {
            write_npy(&self.array_path(dir, name), array)?;
        }
        // Last: its presence completes the set for readers that check existence only (Megatron).
        write_atomic(&self.description_path(dir), self.description.as_bytes())?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    /// Loads the arrays from the cache or builds them (and writes the cache). `validate`
    /// checks loaded arrays beyond their headers (shapes, ranges); `build` returns arrays in
    /// the order of `self.arrays`.
    pub fn load_or_build(
        &self,
        validate: &dyn Fn(&[NpyArray]) -> Result<()>,
        build: &mut dyn FnMut() -> Result<Vec<NpyArray>>,
    ) -> Result<(Vec<NpyArray>, CacheStatus)> {
        let Some(dir) = self.dir else { return Ok((build()?, CacheStatus::Uncached)) };
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!(
                "WARNING: cannot create the dataset index cache directory `{}` ({e}); building the indices in \
                 memory. Pass --data-cache-path DIR with a writable DIR to cache them.",
                dir.display()
            );
            return Ok((build()?, CacheStatus::Uncached));
        }
        let started = Instant::now();
        loop {
            match self.try_load(dir, validate) {
                Ok(Some(arrays)) => return Ok((arrays, CacheStatus::Hit)),
                Ok(None) => {}
                Err(e) => eprintln!("WARNING: dataset index cache: {e:#}; rebuilding it"),
            }
            let lock_path = self.lock_path(dir);
            match OpenOptions::new().write(true).create_new(true).open(&lock_path) {
                Ok(mut lock) => {
                    let _guard = LockGuard(lock_path.clone());
                    let _ = writeln!(lock, "{}", std::process::id());
                    let _ = lock.sync_all();
                    // Another builder may have finished between our check and the lock.
                    if let Ok(Some(arrays)) = self.try_load(dir, validate) {
                        return Ok((arrays, CacheStatus::Hit));
                    }
                    let arrays = build()?;
                    return match self.write(dir, &arrays) {
                        Ok(()) => Ok((arrays, CacheStatus::Built)),
                        Err(e) => {
                            eprintln!("WARNING: cannot write the dataset index cache in `{}`: {e:#}", dir.display());
                            Ok((arrays, CacheStatus::Uncached))
                        }
                    };
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    wait_for_lock(&lock_path, started)?;
                }
                Err(e) => {
                    eprintln!(
                        "WARNING: cannot create the lock `{}` in the dataset index cache ({e}); building the indices \
                         in memory. Pass --data-cache-path DIR with a writable DIR to cache them.",
                        lock_path.display()
                    );
                    return Ok((build()?, CacheStatus::Uncached));
                }
            }
        }
    }
}

/// Removes the lock file when the builder is done (or fails).
struct LockGuard(PathBuf);

impl Drop for LockGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Whether the lock was left behind by a process that no longer runs (Linux: no `/proc/PID`).
fn lock_is_stale(lock: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(lock) else { return false };
    let Ok(pid) = text.trim().parse::<u32>() else { return false };
    Path::new("/proc/self").exists() && !Path::new(&format!("/proc/{pid}")).exists()
}

/// Waits until `lock` disappears; removes it if its owner died.
fn wait_for_lock(lock: &Path, started: Instant) -> Result<()> {
    while lock.exists() {
        if lock_is_stale(lock) {
            eprintln!("WARNING: removing the stale dataset cache lock `{}` (its process is gone)", lock.display());
            let _ = std::fs::remove_file(lock);
            break;
        }
        if started.elapsed() > LOCK_TIMEOUT {
            return Err(anyhow!(
                "waited {} s for another process to build the dataset index cache (lock `{}`); if no other run \
                 is building it, delete the lock file and retry",
                LOCK_TIMEOUT.as_secs(),
                lock.display()
            ));
        }
        std::thread::sleep(POLL);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::npy::NpyDType;

    fn entry<'a>(dir: &'a Path, description: &'a str) -> CacheEntry<'a> {
        CacheEntry { dir: Some(dir), base: "h-Test-train".into(), description, arrays: &["a", "b"] }
    }

    fn arrays(v: i64) -> Result<Vec<NpyArray>> {
        Ok(vec![
            NpyArray::new(NpyDType::I32, vec![2], vec![v, v + 1])?,
            NpyArray::new(NpyDType::I64, vec![1], vec![v])?,
        ])
    }

    #[test]
    fn builds_once_then_hits_and_rebuilds_damaged_files() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let ok = |_: &[NpyArray]| Ok(());
        let mut builds = 0;
        let e = entry(dir.path(), "desc");
        let (a, s) = e.load_or_build(&ok, &mut || {
            builds += 1;
            arrays(7)
        })?;
        assert_eq!((s, builds), (CacheStatus::Built, 1));
        let (b, s) = e.load_or_build(&ok, &mut || arrays(99))?;
        assert_eq!((s, &b), (CacheStatus::Hit, &a));
        // A truncated array is rebuilt.
        let path = e.array_path(dir.path(), "b");
        let bytes = std::fs::read(&path)?;
        std::fs::write(&path, &bytes[..bytes.len() - 3])?;
        let (c, s) = e.load_or_build(&ok, &mut || arrays(7))?;
        assert_eq!((s, &c), (CacheStatus::Built, &a));
        // A different description under the same name is stale.
        let stale = entry(dir.path(), "other");
        assert_eq!(stale.load_or_build(&ok, &mut || arrays(7))?.1, CacheStatus::Built);
        // A failing validation rebuilds too.
        let bad = |_: &[NpyArray]| Err(anyhow!("out of range"));
        assert_eq!(stale.load_or_build(&bad, &mut || arrays(7))?.1, CacheStatus::Built);
        assert!(!e.lock_path(dir.path()).exists());
        Ok(())
    }

    #[test]
    fn a_lock_left_by_a_dead_process_is_removed() -> Result<()> {
        if !Path::new("/proc/self").exists() {
            eprintln!("SKIP: no /proc to tell whether the lock's process runs");
            return Ok(());
        }
        let dir = tempfile::tempdir()?;
        let e = entry(dir.path(), "d");
        // PIDs are below 2^22 on Linux, so this one cannot run.
        std::fs::write(e.lock_path(dir.path()), "4294967\n")?;
        assert_eq!(e.load_or_build(&|_| Ok(()), &mut || arrays(1))?.1, CacheStatus::Built);
        assert!(!e.lock_path(dir.path()).exists());
        Ok(())
    }

    #[test]
    fn unwritable_directory_falls_back_to_memory() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("not_a_dir");
        std::fs::write(&file, b"x")?;
        let sub = file.join("cache");
        let e = entry(&sub, "d");
        let (_, s) = e.load_or_build(&|_| Ok(()), &mut || arrays(1))?;
        assert_eq!(s, CacheStatus::Uncached);
        Ok(())
    }
}
