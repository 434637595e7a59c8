//! Saving: every model-parallel rank with `dp_rank == 0` (and `cp_rank == 0`) writes its own
//! safetensors file (expert weights: expert-data-parallel rank 0 of each expert-parallel
//! rank), the ranks exchange their tensor indices, and global rank 0 writes `metadata.json`,
//! commits the directory and moves the tracker.
//!
//! Order (each step durable before the next): rank 0 removes crash leftovers and creates
//! `iter_N.tmp/` → all ranks agree → writers write and fsync their shard file → indices are
//! all-gathered (this is also the barrier; a failure on any rank fails every rank and commits
//! nothing) → rank 0 writes and fsyncs `metadata.json`, fsyncs `iter_N.tmp/`, renames it to
//! `iter_N/` (moving an existing `iter_N/` aside first), fsyncs `SAVE/`, replaces the tracker
//! → all ranks agree. A kill at any point leaves the tracker naming a complete directory.

use crate::layout::{
    clean_stale, iteration_dir, replaced_dir, shard_file_name, sync_dir, sync_file, tmp_dir, write_file_synced,
    write_tracker,
};
use crate::metadata::{
    to_safetensors_dtype, CheckpointMeta, CheckpointMetadata, SavedParallel, ShardEntry, TensorEntry, FORMAT,
    FORMAT_VERSION, METADATA_FILE, OPTIMIZER_PREFIX,
};
use crate::region::{intersect, volume};
use crate::sync::{agree, all_gather_bytes};
use anyhow::{anyhow, bail, Context, Result};
use megatron_core::{Backend, DType, DeviceTensor, OptimizerState, ParallelContext, Param, ParamLayout};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Saves `iteration` under `dir` (the `--save` directory) and returns `dir/iter_NNNNNNN`.
///
/// Collective: every rank of `ctx` must call it with its own parameters (this rank's TP shard
/// of its pipeline stage) and optimizer state (`"{param}.{state}"` tensors, each the shape of
/// its parameter). Replicated parameters (`tp_axis == None`) are stored once, by TP rank 0.
/// `meta` only needs to be meaningful on rank 0, which writes `metadata.json`.
pub fn save(
    dir: &Path,
    iteration: u64,
    model_params: &[&Param],
    optimizer: Option<OptimizerState>,
    meta: CheckpointMeta,
    backend: &dyn Backend,
    ctx: &ParallelContext,
) -> Result<PathBuf> {
    let is_root = ctx.rank == 0;
    let prepared = if is_root { prepare(dir, iteration) } else { Ok(()) };
    agree(ctx, prepared, "preparing the checkpoint directory")?;

    let writes = dense_writer(ctx) || expert_writer(ctx);
    let index = if writes {
        write_shard(dir, iteration, model_params, optimizer.as_ref(), backend, ctx)
    } else {
        Ok(BTreeMap::new())
    };
    let indices = exchange_indices(ctx, backend, index, iteration)?;

    let committed = if is_root {
        let scalars = optimizer.as_ref().map(|o| o.scalars.clone());
        commit(dir, iteration, meta, scalars, &indices, ctx)
    } else {
        Ok(())
    };
    agree(ctx, committed, "committing the checkpoint")?;
    Ok(iteration_dir(dir, iteration))
}

fn prepare(dir: &Path, iteration: u64) -> Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create checkpoint directory {} (--save)", dir.display()))?;
    clean_stale(dir)?;
    let tmp = tmp_dir(dir, iteration);
    std::fs::create_dir(&tmp).with_context(|| format!("cannot create {}", tmp.display()))
}

/// Whether this rank stores the shard of a parameter with `layout`. A pipeline stage's copy of
/// another stage's parameter (`shared_copy`, the tied embedding on the last stage) is stored
/// once, by the original's stage; loading finds it by its (identical) name.
/// Expert weights (`expert_parallel`) are stored by their expert-data-parallel rank 0 (SPEC
/// §5.8), named by global expert id, so a checkpoint saved at one EP size loads at another.
/// Sharded experts (ep · etp > 1) are whole on every rank of their expert-TP group with
/// etp = 1 whatever the dense TP rank, so the replica test is on the expert-TP rank.
fn stores(layout: &ParamLayout, ctx: &ParallelContext) -> bool {
    let sharded_expert = layout.expert_parallel && ctx.experts_sharded();
    let writer = if layout.expert_parallel { expert_writer(ctx) } else { dense_writer(ctx) };
    let tp_replica0 = if sharded_expert { ctx.etp_rank == 0 } else { ctx.tp_rank == 0 };
    writer && !layout.shared_copy && (layout.tp_axis.is_some() || tp_replica0)
}

fn dense_writer(ctx: &ParallelContext) -> bool {
    ctx.dp_rank == 0 && ctx.cp_rank == 0
}

/// Rank 0 of the expert-data-parallel group (with ep = 1 the same rank as [`dense_writer`]).
fn expert_writer(ctx: &ParallelContext) -> bool {
    ctx.edp_group.ranks.first() == Some(&ctx.rank)
}

/// The shard file of this rank: expert-parallel (and expert-TP) ranks after the first get
/// their own file; (tp, pp, ep, etp) is unique among the ranks that write.
fn file_name(ctx: &ParallelContext) -> String {
    let base = shard_file_name(ctx.tp_rank, ctx.pp_rank);
    let mut suffix = String::new();
    if ctx.ep_rank > 0 {
        suffix += &format!("_ep{:03}", ctx.ep_rank);
    }
    if ctx.etp_rank > 0 {
        suffix += &format!("_etp{:03}", ctx.etp_rank);
    }
    base.replace(".safetensors", &format!("{suffix}.safetensors"))
}

/// A tensor ready for the safetensors file.
struct Staged {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

fn write_shard(
    dir: &Path,
    iteration: u64,
    params: &[&Param],
    optimizer: Option<&OptimizerState>,
    backend: &dyn Backend,
    ctx: &ParallelContext,
) -> Result<BTreeMap<String, TensorEntry>> {
    let file = file_name(ctx);
    let mut by_name: HashMap<&str, &Param> = HashMap::new();
    for p in params {
        if by_name.insert(&p.name, p).is_some() {
            bail!("two model parameters are named `{}`; checkpoint names must be unique", p.name);
        }
    }
    let mut staged = Vec::new();
    let mut index = BTreeMap::new();
    let mut stage = |name: String, t: &DeviceTensor, layout: &ParamLayout| -> Result<()> {
        let shape = t.shape().to_vec();
        let offset = shard_offset(&name, &shape, layout)?;
        let bytes = backend.to_host(t).with_context(|| format!("cannot copy `{name}` to the host"))?.to_le_bytes();
        let mut entry = TensorEntry {
            dtype: t.dtype().safetensors_name().to_string(),
            global_shape: layout.global_shape.clone(),
            shards: Vec::new(),
        };
        let boxes = layout.shard_boxes(&shape);
        if boxes.len() == 1 {
            entry.shards.push(ShardEntry { file: file.clone(), offset, shape: shape.clone(), key: None });
            staged.push(Staged { name: name.clone(), dtype: t.dtype(), shape, bytes });
        } else {
            // A chunked parameter (split along dim 0): block c's rows are contiguous locally and
            // go to their own place in the global tensor, under their own key.
            let whole_blocks =
                !layout.tp_blocks.is_empty() || shape.first().is_some_and(|r| r.is_multiple_of(layout.tp_chunks));
            if layout.tp_axis != Some(0) || shape.is_empty() || !whole_blocks {
                bail!(
                    "`{name}`: a parameter of {} tensor-parallel blocks must be split along dim 0 into \
                     whole blocks (local shape {shape:?})",
                    layout.tp_chunks
                );
            }
            let row_bytes = bytes.len() / shape[0].max(1);
            for (c, (local_row, slice)) in boxes.into_iter().enumerate() {
                let (offset, piece_shape): (Vec<usize>, Vec<usize>) = slice.into_iter().unzip();
                let key = format!("{name}#{c}");
                let rows = local_row * row_bytes..(local_row + piece_shape[0]) * row_bytes;
                entry.shards.push(ShardEntry {
                    file: file.clone(),
                    offset,
                    shape: piece_shape.clone(),
                    key: Some(key.clone()),
                });
                staged.push(Staged { name: key, dtype: t.dtype(), shape: piece_shape, bytes: bytes[rows].to_vec() });
            }
        }
        index.insert(name, entry);
        Ok(())
    };
    for p in params.iter().filter(|p| stores(&p.layout, ctx)) {
        stage(p.name.clone(), &p.value, &p.layout)?;
    }
    for (key, t) in optimizer.map(|o| o.tensors.as_slice()).unwrap_or_default() {
        let p = key.rsplit_once('.').and_then(|(param, _state)| by_name.get(param)).ok_or_else(|| {
            anyhow!(
                "optimizer state tensor `{key}` does not name a parameter of this rank: keys must be \
                 `{{param}}.{{state}}` with `{{param}}` one of the model's parameter names"
            )
        })?;
        if t.shape() != p.value.shape() {
            bail!(
                "optimizer state `{key}` has shape {:?} but parameter `{}` has {:?}: per-parameter \
                 state must match its parameter's shape",
                t.shape(),
                p.name,
                p.value.shape()
            );
        }
        if stores(&p.layout, ctx) {
            stage(format!("{OPTIMIZER_PREFIX}{key}"), t, &p.layout)?;
        }
    }
    if !staged.is_empty() {
        let path = tmp_dir(dir, iteration).join(&file);
        write_safetensors(&path, &staged)?;
    }
    Ok(index)
}

/// Offsets of this shard in the global tensor, checked against the global shape so a layout
/// bug fails the save instead of producing an unloadable checkpoint.
fn shard_offset(name: &str, shape: &[usize], layout: &ParamLayout) -> Result<Vec<usize>> {
    if shape.len() != layout.global_shape.len() {
        bail!("`{name}`: local shape {shape:?} and global shape {:?} differ in rank", layout.global_shape);
    }
    let slice = layout.shard_slice(shape);
    for (d, &(off, len)) in slice.iter().enumerate() {
        if off + len > layout.global_shape[d] {
            bail!(
                "`{name}`: shard {shape:?} at offset {off} of dim {d} exceeds the global shape {:?} \
                 (tp_rank {} of tp_size {})",
                layout.global_shape,
                layout.tp_rank,
                layout.tp_size
            );
        }
    }
    Ok(slice.into_iter().map(|(off, _)| off).collect())
}

fn write_safetensors(path: &Path, staged: &[Staged]) -> Result<()> {
    let views = staged
        .iter()
        .map(|s| {
            let view = safetensors::tensor::TensorView::new(to_safetensors_dtype(s.dtype), s.shape.clone(), &s.bytes)
                .map_err(|e| anyhow!("tensor `{}`: {e:?}", s.name))?;
            Ok((s.name.as_str(), view))
        })
        .collect::<Result<Vec<_>>>()?;
    let info = HashMap::from([("format".to_string(), FORMAT.to_string())]);
    safetensors::tensor::serialize_to_file(views, &Some(info), path)
        .map_err(|e| anyhow!("cannot write {}: {e:?}", path.display()))?;
    sync_file(path)
}

/// What one rank reports after writing: its tensor index or its error.
#[derive(Serialize, Deserialize)]
struct RankReport {
    error: Option<String>,
    tensors: BTreeMap<String, TensorEntry>,
}

/// All-gathers every rank's index; any rank's failure fails every rank with all messages.
fn exchange_indices(
    ctx: &ParallelContext,
    backend: &dyn Backend,
    local: Result<BTreeMap<String, TensorEntry>>,
    iteration: u64,
) -> Result<Vec<BTreeMap<String, TensorEntry>>> {
    let report = match local {
        Ok(tensors) => RankReport { error: None, tensors },
        Err(e) if ctx.world_size() == 1 => return Err(e),
        Err(e) => RankReport { error: Some(format!("{e:#}")), tensors: BTreeMap::new() },
    };
    let gathered = all_gather_bytes(ctx, backend, serde_json::to_vec(&report)?)?;
    let mut errors = Vec::new();
    let mut indices = Vec::new();
    for (rank, bytes) in gathered.iter().enumerate() {
        let report: RankReport = serde_json::from_slice(bytes.trim_ascii_end())
            .with_context(|| format!("garbled checkpoint index received from rank {rank}"))?;
        match report.error {
            Some(e) => errors.push(format!("rank {rank}: {e}")),
            None => indices.push(report.tensors),
        }
    }
    if !errors.is_empty() {
        bail!("saving checkpoint iteration {iteration} failed; nothing was committed: {}", errors.join("; "));
    }
    Ok(indices)
}

/// Merges per-rank indices: identical slices saved by several ranks (tied embeddings) are
/// kept once; partly overlapping or incomplete coverage is a layout bug and an error.
fn merge(indices: &[BTreeMap<String, TensorEntry>]) -> Result<BTreeMap<String, TensorEntry>> {
    let mut merged: BTreeMap<String, TensorEntry> = BTreeMap::new();
    for index in indices {
        for (name, entry) in index {
            let Some(have) = merged.get_mut(name) else {
                merged.insert(name.clone(), entry.clone());
                continue;
            };
            if have.dtype != entry.dtype || have.global_shape != entry.global_shape {
                bail!(
                    "ranks disagree on tensor `{name}`: {} {:?} vs {} {:?}",
                    have.dtype,
                    have.global_shape,
                    entry.dtype,
                    entry.global_shape
                );
            }
            for shard in &entry.shards {
                if have.shards.iter().any(|s| s.offset == shard.offset && s.shape == shard.shape) {
                    continue;
                }
                if let Some(s) =
                    have.shards.iter().find(|s| intersect(&s.offset, &s.shape, &shard.offset, &shard.shape).is_some())
                {
                    bail!("tensor `{name}`: shards in {} and {} overlap without being equal", s.file, shard.file);
                }
                have.shards.push(shard.clone());
            }
        }
    }
    for (name, entry) in &merged {
        let covered: usize = entry.shards.iter().map(|s| volume(&s.shape)).sum();
        if covered != volume(&entry.global_shape) {
            bail!(
                "tensor `{name}`: the saved shards cover {covered} of its {} elements (global shape {:?}); \
                 some tensor-parallel rank did not save its slice",
                volume(&entry.global_shape),
                entry.global_shape
            );
        }
    }
    Ok(merged)
}

fn commit(
    dir: &Path,
    iteration: u64,
    meta: CheckpointMeta,
    optimizer_scalars: Option<serde_json::Value>,
    indices: &[BTreeMap<String, TensorEntry>],
    ctx: &ParallelContext,
) -> Result<()> {
    let metadata = CheckpointMetadata {
        format: FORMAT.to_string(),
        format_version: FORMAT_VERSION,
        iteration,
        meta,
        optimizer_saved: optimizer_scalars.is_some(),
        optimizer: optimizer_scalars.unwrap_or_default(),
        tensors: merge(indices)?,
        parallel: SavedParallel { tp: ctx.tp_size(), pp: ctx.pp_size(), dp: ctx.dp_size(), cp: ctx.grid.cp },
    };
    let tmp = tmp_dir(dir, iteration);
    write_file_synced(&tmp.join(METADATA_FILE), &serde_json::to_vec_pretty(&metadata)?)?;
    sync_dir(&tmp)?;

    let final_dir = iteration_dir(dir, iteration);
    let replaced = replaced_dir(dir, iteration);
    if final_dir.exists() {
        // `clean_stale` removed any older `.replaced` because `final_dir` exists.
        std::fs::rename(&final_dir, &replaced)
            .with_context(|| format!("cannot move old {} aside to {}", final_dir.display(), replaced.display()))?;
    }
    std::fs::rename(&tmp, &final_dir)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), final_dir.display()))?;
    sync_dir(dir)?;
    write_tracker(dir, iteration)?;
    if replaced.exists() {
        std::fs::remove_dir_all(&replaced)
            .with_context(|| format!("cannot remove the replaced checkpoint {}", replaced.display()))?;
    }
    Ok(())
}
