//! Megatron-LM's checkpoint directory layout (SPEC §7.1–7.2): the tracker file, `iter_NNNNNNN`
//! / `release` directories, and the `mp_rank_XX[_YYY]` shard directories of the legacy format.

use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const TRACKER: &str = "latest_checkpointed_iteration.txt";
pub const SHARD_FILE: &str = "model_optim_rng.pt";

/// What the tracker names: an iteration, or `release` (loads as iteration 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tracked {
    Iteration(u64),
    Release,
}

/// Reads `dir/latest_checkpointed_iteration.txt`; `None` when there is none.
pub fn read_tracker(dir: &Path) -> Result<Option<Tracked>> {
    let path = dir.join(TRACKER);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(anyhow!("cannot read {}: {e}", path.display())),
    };
    let t = text.trim();
    if t == "release" {
        return Ok(Some(Tracked::Release));
    }
    t.parse()
        .map(|i| Some(Tracked::Iteration(i)))
        .map_err(|_| anyhow!("{}: expected an iteration number or `release`, found {t:?}", path.display()))
}

/// `iter_0000010` or `release`.
pub fn iteration_dir_name(t: Tracked) -> String {
    match t {
        Tracked::Iteration(i) => format!("iter_{i:07}"),
        Tracked::Release => "release".to_string(),
    }
}

/// `mp_rank_{tp:02}` (pp = 1) or `mp_rank_{tp:02}_{pp:03}`.
pub fn shard_dir_name(tp: usize, pp: usize, pp_size: usize) -> String {
    if pp_size > 1 {
        format!("mp_rank_{tp:02}_{pp:03}")
    } else {
        format!("mp_rank_{tp:02}")
    }
}

/// Whether `dir` holds a Megatron-LM legacy checkpoint (tracker + `mp_rank_*` shard dirs).
pub fn is_legacy(dir: &Path) -> bool {
    let Ok(Some(t)) = read_tracker(dir) else { return false };
    let iter = dir.join(iteration_dir_name(t));
    std::fs::read_dir(&iter).is_ok_and(|d| {
        d.flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("mp_rank_") && e.path().join(SHARD_FILE).exists())
    })
}

/// Whether `dir` holds a Megatron-Core `torch_dist` checkpoint (tracker + `.metadata`).
pub fn is_torch_dist(dir: &Path) -> bool {
    let Ok(Some(t)) = read_tracker(dir) else { return false };
    dir.join(iteration_dir_name(t)).join(".metadata").exists()
}

/// The shard files of an iteration directory, as `[pp][tp]`, checking the grid is complete.
pub fn shard_grid(iter_dir: &Path) -> Result<Vec<Vec<PathBuf>>> {
    let mut found: BTreeMap<(usize, usize), PathBuf> = BTreeMap::new();
    let entries = std::fs::read_dir(iter_dir).with_context(|| format!("cannot list {}", iter_dir.display()))?;
    let mut pipelined = None;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(rest) = name.strip_prefix("mp_rank_") else { continue };
        let parts: Vec<&str> = rest.split('_').collect();
        let num = |s: &str| {
            s.parse::<usize>().map_err(|_| anyhow!("{}: bad shard directory name `{name}`", iter_dir.display()))
        };
        let (tp, pp) = match parts.as_slice() {
            [tp] => (num(tp)?, 0),
            [tp, pp] => (num(tp)?, num(pp)?),
            _ => bail!(
                "{}: `{name}` is an expert-parallel shard (mp_rank_TT_PPP_EEE); expert parallelism is not supported",
                iter_dir.display()
            ),
        };
        if tp >= 4096 || pp >= 4096 {
            bail!("{}: shard `{name}` has an implausible rank", iter_dir.display());
        }
        let is_pp = parts.len() == 2;
        if *pipelined.get_or_insert(is_pp) != is_pp {
            bail!("{}: mixes mp_rank_TT and mp_rank_TT_PPP directories", iter_dir.display());
        }
        found.insert((pp, tp), e.path().join(SHARD_FILE));
    }
    if found.is_empty() {
        bail!("{} has no mp_rank_* shard directories (not a legacy torch checkpoint)", iter_dir.display());
    }
    let pp_size = found.keys().map(|k| k.0).max().unwrap_or(0) + 1;
    let tp_size = found.keys().map(|k| k.1).max().unwrap_or(0) + 1;
    let mut grid = Vec::with_capacity(pp_size);
    for pp in 0..pp_size {
        let mut row = Vec::with_capacity(tp_size);
        for tp in 0..tp_size {
            let dir = iter_dir.join(shard_dir_name(tp, pp, if pipelined == Some(true) { 2 } else { 1 }));
            let path = found.remove(&(pp, tp)).unwrap_or_else(|| dir.join(SHARD_FILE));
            if !path.exists() {
                bail!(
                    "missing shard {} (tp rank {tp}, pp rank {pp} of a tp{tp_size} x pp{pp_size} checkpoint)",
                    path.display()
                );
            }
            row.push(path);
        }
        grid.push(row);
    }
    Ok(grid)
}
