//! Reading Megatron-LM's legacy `torch` checkpoints: every `mp_rank_*` shard opened, the model
//! shape read from the stored `args`, and each tensor reassembled to its full (tp = 1, pp = 1)
//! form under megatron-rs's (= Megatron-Core's) names by Megatron's partitioning rules
//! ([`crate::partition`]).

use crate::layout::{iteration_dir_name, read_tracker, shard_grid, Tracked, TRACKER};
use crate::partition::{local_to_global, Shape};
use crate::torchzip::{TensorData, TorchFile};
use crate::value::Value;
use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// An opened legacy checkpoint: all shard files decoded (tensors not read yet).
pub struct LegacyCheckpoint {
    pub iter_dir: PathBuf,
    pub tracked: Tracked,
    /// Shard files as `[pp][tp]`.
    pub shards: Vec<Vec<TorchFile>>,
    /// The stored `args` Namespace of tp/pp rank 0.
    pub args: Value,
    pub shape: Shape,
}

impl LegacyCheckpoint {
    /// The iteration (0 for `release`, as Megatron loads it).
    pub fn iteration(&self) -> u64 {
        match self.tracked {
            Tracked::Iteration(i) => i,
            Tracked::Release => 0,
        }
    }

    fn root(&self) -> &Value {
        &self.shards[0][0].root
    }

    /// The OptimizerParamScheduler state (older files: `lr_scheduler`), if stored.
    pub fn scheduler_state(&self) -> Option<&Value> {
        self.root().get("opt_param_scheduler").or_else(|| self.root().get("lr_scheduler"))
    }

    /// `checkpoint_version` (0 when absent, as Megatron assumes).
    pub fn checkpoint_version(&self) -> f64 {
        self.root().get("checkpoint_version").and_then(Value::as_f64).unwrap_or(0.0)
    }

    /// What the optimizer entry of rank (0, 0) holds, for `inspect`.
    pub fn optimizer_summary(&self) -> String {
        match self.root().get("optimizer") {
            None => "none (saved with --no-save-optim)".to_string(),
            Some(o) => {
                let keys: Vec<String> = o.items().unwrap_or(&[]).iter().map(|(k, _)| k.to_string()).collect();
                match crate::optim_read::read_optimizer(self) {
                    Ok(Some(full)) => {
                        let mut states: Vec<&str> = full.tensors.keys().map(|(_, s)| s.as_str()).collect();
                        states.sort_unstable();
                        states.dedup();
                        let groups: Vec<String> = full
                            .param_groups
                            .iter()
                            .map(|g| format!("wd_mult {} lr {}", g["wd_mult"], g["lr"]))
                            .collect();
                        format!(
                            "Adam at step {}: {} for {} parameters; param groups [{}]; grad_scaler {}",
                            full.step,
                            states.join(", "),
                            full.tensors.len() / states.len().max(1),
                            groups.join("; "),
                            full.grad_scaler.map_or("none".to_string(), |g| g.to_string())
                        )
                    }
                    Ok(None) => "none".to_string(),
                    Err(e) => format!("present (keys {}) but not readable by megatron-rs: {e:#}", keys.join(", ")),
                }
            }
        }
    }

    /// Every model tensor at full size under its megatron-rs name, in a stable order.
    /// `progress(done, total)` is called after each shard file is read.
    pub fn full_tensors(&self, progress: &mut dyn FnMut(usize, usize)) -> Result<BTreeMap<String, TensorData>> {
        // name -> [tp] shards, collected over every pipeline stage and virtual chunk.
        let mut parts: BTreeMap<String, Vec<Option<TensorData>>> = BTreeMap::new();
        let tp = self.shape.tp;
        let total = self.shards.len() * tp;
        for (pp_rank, row) in self.shards.iter().enumerate() {
            for (tp_rank, file) in row.iter().enumerate() {
                for (chunk, model) in model_chunks(&file.root, file.path())? {
                    let items = model.items().ok_or_else(|| {
                        anyhow!("{}: `model` is a {}, expected a state dict", file.path().display(), model.kind())
                    })?;
                    for (k, v) in items {
                        let Value::Str(key) = k else { continue };
                        let Some(name) = local_to_global(key, &self.shape, pp_rank, chunk)
                            .with_context(|| format!("{}: tensor `{key}`", file.path().display()))?
                        else {
                            continue;
                        };
                        let Value::Tensor(t) = v else {
                            if matches!(v, Value::None) {
                                continue;
                            }
                            bail!("{}: `{key}` is a {}, expected a tensor", file.path().display(), v.kind());
                        };
                        let slot = parts.entry(name.clone()).or_insert_with(|| vec![None; tp]);
                        if slot[tp_rank].is_some() {
                            bail!(
                                "{}: `{key}` maps to `{name}`, which another shard also holds",
                                file.path().display()
                            );
                        }
                        slot[tp_rank] = Some(file.tensor(t, key)?);
                    }
                }
                progress(pp_rank * tp + tp_rank + 1, total);
            }
        }
        let mut out = BTreeMap::new();
        for (name, shards) in parts {
            let shards: Vec<TensorData> = shards
                .into_iter()
                .enumerate()
                .map(|(r, s)| {
                    s.ok_or_else(|| {
                        anyhow!("tensor `{name}` is missing from tp rank {r} of {}", self.iter_dir.display())
                    })
                })
                .collect::<Result<_>>()?;
            let full = crate::partition::merge(&name, shards, &self.shape)?;
            out.insert(name, full);
        }
        crate::partition::check_complete(&out, &self.shape, &self.iter_dir)?;
        Ok(out)
    }
}

/// `model` (one chunk) or `model0`, `model1`, … (virtual pipeline chunks), in chunk order.
pub(crate) fn model_chunks<'a>(root: &'a Value, path: &Path) -> Result<Vec<(usize, &'a Value)>> {
    if let Some(m) = root.get("model") {
        return Ok(vec![(0, m)]);
    }
    let mut chunks = Vec::new();
    while let Some(m) = root.get(&format!("model{}", chunks.len())) {
        chunks.push((chunks.len(), m));
    }
    if chunks.is_empty() {
        bail!("{} has no `model` (or `model0`) entry: not a Megatron-LM model checkpoint", path.display());
    }
    Ok(chunks)
}

/// Opens `dir` (a `--save` directory of Megatron-LM) at the tracker's iteration, or at `step`.
pub fn open(dir: &Path, step: Option<u64>) -> Result<LegacyCheckpoint> {
    let tracked = match step {
        Some(i) => Tracked::Iteration(i),
        None => read_tracker(dir)?.ok_or_else(|| anyhow!("{} has no {TRACKER}", dir.display()))?,
    };
    let iter_dir = dir.join(iteration_dir_name(tracked));
    if !iter_dir.is_dir() {
        bail!("{} does not exist (named by {})", iter_dir.display(), dir.join(TRACKER).display());
    }
    let grid = shard_grid(&iter_dir)?;
    let mut shards = Vec::with_capacity(grid.len());
    for row in &grid {
        shards.push(row.iter().map(|p| TorchFile::open(p)).collect::<Result<Vec<_>>>()?);
    }
    let first = &shards[0][0];
    let args = first
        .root
        .get("args")
        .cloned()
        .ok_or_else(|| anyhow!("{} has no `args`: cannot tell the model shape", first.path().display()))?;
    let shape = Shape::from_args(&args, first.path())?;
    if shape.tp != grid[0].len() || shape.pp != grid.len() {
        bail!(
            "{}: args say tp{} x pp{}, the directory holds tp{} x pp{} shards (missing or extra mp_rank_* dirs)",
            iter_dir.display(),
            shape.tp,
            shape.pp,
            grid[0].len(),
            grid.len()
        );
    }
    if let Tracked::Iteration(i) = tracked {
        let stored = first.root.get("iteration").or_else(|| first.root.get("total_iters")).and_then(Value::as_i64);
        if stored.is_some_and(|s| s != i as i64) {
            bail!("{}: stores iteration {stored:?}, its directory is for {i}", first.path().display());
        }
    }
    Ok(LegacyCheckpoint { iter_dir, tracked, shards, args, shape })
}
