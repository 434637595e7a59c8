//! Writing full tensors as a Megatron-LM legacy checkpoint at a target tp x pp: each rank's
//! `model` state dict (stage-local layer names, tp shards cut by [`crate::partition::split`],
//! the last stage's copy of a tied embedding as `output_layer.weight`), `args` as an
//! `argparse.Namespace` with the target sizes, `checkpoint_version` 3.0, `iteration` and the
//! scheduler state; the tracker is written last, after every shard.

use crate::layout::{iteration_dir_name, shard_dir_name, Tracked, SHARD_FILE, TRACKER};
use crate::native::resize_vocab;
use crate::optim_read::FullOptimizerState;
use crate::optim_write::{module_order, rank_optimizer, GroupHyper, RankParam};
use crate::partition::{global_to_local, split, Shape};
use crate::torchzip::TensorData;
use crate::writer::{torch_save, Out};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Writes `tensors` (full, megatron-rs names) under `save` for `iteration`, laid out for
/// `target` (its tp/pp; virtual pipelines are not written). `args` is the run's args as JSON
/// (Megatron's names); the parallel sizes and padded vocabulary are set to the target's.
#[allow(clippy::too_many_arguments)] // each is a separate part of the checkpoint
pub fn write_legacy(
    save: &Path,
    iteration: u64,
    tensors: &BTreeMap<String, TensorData>,
    target: &Shape,
    args: &serde_json::Value,
    scheduler: &serde_json::Value,
    optimizer: Option<&OptimizerOut>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<PathBuf> {
    if target.vp != 1 {
        bail!("writing virtual-pipeline (model0/model1) checkpoints is not supported");
    }
    let mut args = args.clone();
    let m = args.as_object_mut().context("the checkpoint's args are not a JSON object")?;
    m.insert("tensor_model_parallel_size".into(), target.tp.into());
    m.insert("pipeline_model_parallel_size".into(), target.pp.into());
    m.insert("padded_vocab_size".into(), target.padded_vocab.into());
    m.insert("virtual_pipeline_model_parallel_size".into(), serde_json::Value::Null);
    m.insert("iteration".into(), iteration.into());
    let ns = match Out::from_json(&args) {
        Out::Dict(items) => Out::Namespace(items),
        _ => unreachable!("an object converts to a dict"),
    };
    let iter_dir = save.join(iteration_dir_name(Tracked::Iteration(iteration)));
    let total = target.tp * target.pp;
    for pp in 0..target.pp {
        for tp in 0..target.tp {
            // (local name, global name, shard), sorted into Megatron's module order below.
            let mut entries: Vec<(String, String, TensorData)> = Vec::new();
            for (name, t) in tensors {
                let t = resized(name, t, target)?;
                for local in rank_names(name, target, pp)? {
                    let shard =
                        split(name, &t, target.swiglu, tp, target.tp).with_context(|| format!("tensor `{name}`"))?;
                    entries.push((local, name.clone(), shard));
                }
            }
            entries.sort_by_key(|(local, _, _)| module_order(local));
            let mut optim = None;
            if let Some(o) = optimizer {
                let mut params = Vec::with_capacity(entries.len());
                for (local, name, shard) in &entries {
                    let mut states = Vec::new();
                    for ((param, state), full) in o.state.tensors.range((name.clone(), String::new())..) {
                        if param != name {
                            break;
                        }
                        let t = resized(name, full, target)?;
                        let s = split(name, &t, target.swiglu, tp, target.tp)
                            .with_context(|| format!("optimizer `{name}.{state}`"))?;
                        states.push((state.clone(), s));
                    }
                    let states = if states.is_empty() { None } else { Some(states) };
                    params.push(RankParam { local: local.clone(), shape: shard.shape.clone(), states });
                }
                optim = Some(rank_optimizer(&params, o.state, o.half, &o.hyper)?);
            }
            let model: Vec<(String, Out)> =
                entries.into_iter().map(|(local, _, shard)| (local, Out::Tensor(shard))).collect();
            let mut root = vec![
                ("args".into(), ns.clone()),
                ("checkpoint_version".into(), Out::Float(3.0)),
                ("iteration".into(), Out::Int(iteration as i64)),
                ("model".into(), Out::Dict(model)),
            ];
            if let Some(o) = optim {
                root.push(("optimizer".into(), o));
            }
            root.push(("opt_param_scheduler".into(), Out::from_json(scheduler)));
            root.push(("num_floating_point_operations_so_far".into(), Out::Float(0.0)));
            let root = Out::Dict(root);
            let path = iter_dir.join(shard_dir_name(tp, pp, target.pp)).join(SHARD_FILE);
            torch_save(&root, &path)?;
            progress(pp * target.tp + tp + 1, total);
        }
    }
    let tracker = save.join(TRACKER);
    let tmp = save.join(format!("{TRACKER}.tmp"));
    std::fs::write(&tmp, iteration.to_string()).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &tracker).with_context(|| format!("cannot write {}", tracker.display()))?;
    Ok(iter_dir)
}

/// Optimizer state to write with the model: the full state, whether the model is half
/// precision (Megatron's fp16 wrapper with `fp32_from_fp16_params`) and the group settings.
pub struct OptimizerOut<'a> {
    pub state: &'a FullOptimizerState,
    pub half: bool,
    pub hyper: GroupHyper,
}

/// `t` with the target's padded vocabulary when `name` is a vocabulary tensor.
fn resized(name: &str, t: &TensorData, target: &Shape) -> Result<TensorData> {
    if matches!(name, "embedding.word_embeddings.weight" | "output_layer.weight") {
        resize_vocab(t, target.padded_vocab)
    } else {
        Ok(t.clone())
    }
}

/// The stage-local names `name` has on pipeline stage `pp` (the last stage also holds a tied
/// embedding, as `output_layer.weight`: Megatron-Core's layout).
fn rank_names(name: &str, target: &Shape, pp: usize) -> Result<Vec<String>> {
    let mut names: Vec<String> =
        global_to_local(name, target)?.into_iter().filter(|(p, _, _)| *p == pp).map(|(_, _, local)| local).collect();
    if name == "embedding.word_embeddings.weight" && !target.untied && target.pp > 1 && pp == target.pp - 1 {
        names.push("output_layer.weight".to_string());
    }
    Ok(names)
}
