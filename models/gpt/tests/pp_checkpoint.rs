//! Checkpoints of a pipelined GPT: the last stage's copy of the tied word embedding
//! (`shared_copy`) is stored once, by the first stage, and every layout loads the checkpoint
//! by name — a pp = 2 checkpoint equals the single-stage model's tensors, and a pp = 2 model
//! loads it back with the last stage's copy taken from the first stage's tensor.

mod common;

use common::*;
use megatron_checkpoint::{load, save, CheckpointMeta};
use megatron_comm_local::LocalCommunicator;
use megatron_core::{Model, ParallelContext, RankGrid};
use megatron_gpt::GptModel;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// Values after a deterministic per-name perturbation, so the check does not pass on the
/// initial values alone; equal names get equal values on every stage.
fn perturb(model: &mut GptModel) {
    let bk = model.backend();
    for p in model.params_mut() {
        let shift = p.name.len() as f32 * 0.01;
        let mut v = bk.to_host(&p.value).unwrap().to_f32_vec();
        v.iter_mut().enumerate().for_each(|(i, x)| *x += shift + (i % 7) as f32 * 1e-3);
        let shape = p.value.shape().to_vec();
        p.value = bk.from_host(megatron_core::HostBuffer::F32(v), &shape).unwrap();
    }
}

fn values(model: &GptModel) -> BTreeMap<String, Vec<f32>> {
    let bk = model.backend();
    model.params().iter().map(|p| (p.name.clone(), bk.to_host(&p.value).unwrap().to_f32_vec())).collect()
}

/// Every rank of a pp = 2 world builds its stage, runs `f` and returns its values.
fn pp2<F>(config: &megatron_gpt::GptConfig, f: F) -> Vec<BTreeMap<String, Vec<f32>>>
where
    F: Fn(&mut GptModel, &ParallelContext) + Sync,
{
    let grid = RankGrid::new(2, 1, 1, 2).unwrap();
    let comms = LocalCommunicator::world(2, Duration::from_secs(60));
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, comm)| {
                let (ctx, f) = (grid.context(r, comm.clone()), &f);
                s.spawn(move || {
                    let mut model = GptModel::new(config.clone(), backend(), ctx.clone()).unwrap();
                    f(&mut model, &ctx);
                    values(&model)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn save_all(dir: &Path, model: &GptModel, ctx: &ParallelContext) {
    let meta = CheckpointMeta::default();
    save(dir, 1, &model.params(), None, meta, model.backend().as_ref(), ctx).unwrap();
}

#[test]
fn pp2_checkpoint_stores_the_tied_embedding_once_and_loads_into_any_pp() {
    let config = tiny_config(64, 8);
    let dir = tempfile::tempdir().unwrap();
    let saved = pp2(&config, |m, ctx| {
        perturb(m);
        save_all(dir.path(), m, ctx);
    });
    let word = "embedding.word_embeddings.weight";
    assert_eq!(saved[0][word], saved[1][word], "the copy starts equal and gets the same perturbation");

    let ckpt = load(dir.path(), None).unwrap();
    let entry = &ckpt.metadata.tensors[word];
    assert_eq!(entry.shards.len(), 1, "the tied embedding is stored once: {:?}", entry.shards);
    assert_eq!(entry.shards[0].file, megatron_checkpoint::shard_file_name(0, 0));

    // Single stage: every tensor equals the pp = 2 stage that held it.
    let mut whole = tiny_model(config.clone());
    let bk = whole.backend();
    ckpt.load_params(&mut whole.params_mut(), bk.as_ref()).unwrap();
    let loaded = values(&whole);
    for (name, v) in &loaded {
        let stage = saved.iter().find(|s| s.contains_key(name)).unwrap();
        assert_eq!(&stage[name], v, "`{name}` after loading the pp = 2 checkpoint at pp = 1");
    }
    assert_eq!(loaded.len(), saved[0].len() + saved[1].len() - 1);

    // pp = 2 again: the last stage's copy comes from the first stage's tensor.
    let reloaded = pp2(&config, |m, _| {
        let ckpt = load(dir.path(), None).unwrap();
        ckpt.load_params(&mut m.params_mut(), backend().as_ref()).unwrap();
    });
    assert_eq!(reloaded, saved);
}
