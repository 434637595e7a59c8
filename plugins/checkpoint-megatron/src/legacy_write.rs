//! Writing full tensors as a Megatron-LM legacy checkpoint at a target tp x pp: each rank's
//! `model` state dict (stage-local layer names, tp shards cut by [`crate::partition::split`],
//! the last stage's copy of a tied embedding as `output_layer.weight`), `args` as an
//! `argparse.Namespace` with the target sizes, `checkpoint_version` 3.0, `iteration` and the
//! scheduler state; the tracker is written last, after every shard.

use crate::layout::{iteration_dir_name, shard_dir_name, Tracked, SHARD_FILE, TRACKER};
use crate::native::resize_vocab;
use crate::partition::{global_to_local, split, Shape};
use crate::torchzip::TensorData;
use crate::writer::{torch_save, Out};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Writes `tensors` (full, megatron-rs names) under `save` for `iteration`, laid out for
/// `target` (its tp/pp; virtual pipelines are not written). `args` is the run's args as JSON
/// (Megatron's names); the parallel sizes and padded vocabulary are set to the target's.
pub fn write_legacy(
    save: &Path,
    iteration: u64,
    tensors: &BTreeMap<String, TensorData>,
    target: &Shape,
    args: &serde_json::Value,
    scheduler: &serde_json::Value,
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
            let mut model: Vec<(String, Out)> = Vec::new();
            for (name, t) in tensors {
                let t = if matches!(name.as_str(), "embedding.word_embeddings.weight" | "output_layer.weight") {
                    resize_vocab(t, target.padded_vocab)?
                } else {
                    t.clone()
                };
                let places = global_to_local(name, target)?;
                let mut names: Vec<String> =
                    places.into_iter().filter(|(p, _, _)| *p == pp).map(|(_, _, local)| local).collect();
                // The last stage holds the tied head as its own copy (Megatron-Core's layout).
                if name == "embedding.word_embeddings.weight" && !target.untied && target.pp > 1 && pp == target.pp - 1
                {
                    names.push("output_layer.weight".to_string());
                }
                for local in names {
                    let shard =
                        split(name, &t, target.swiglu, tp, target.tp).with_context(|| format!("tensor `{name}`"))?;
                    model.push((local, Out::Tensor(shard)));
                }
            }
            let root = Out::Dict(vec![
                ("args".into(), ns.clone()),
                ("checkpoint_version".into(), Out::Float(3.0)),
                ("iteration".into(), Out::Int(iteration as i64)),
                ("model".into(), Out::Dict(model)),
                ("opt_param_scheduler".into(), Out::from_json(scheduler)),
                ("num_floating_point_operations_so_far".into(), Out::Float(0.0)),
            ]);
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
