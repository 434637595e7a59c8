//! Multi-rank saving with ranks as threads: tp=2 x dp=2 writes two shard files (dp rank 1
//! writes nothing), rank 0's metadata indexes every shard, and the result loads into tp=1
//! and tp=2. A failure on one rank fails every rank and commits nothing.
//!
//! The ranks talk through the real `local` communicator (megatron-comm-local, a
//! dev-dependency), not an in-test copy of one.

mod common;

use common::*;
use megatron_checkpoint::{load, read_tracker, save, CheckpointMeta};
use megatron_comm_local::LocalCommunicator;
use megatron_core::{RankGrid, Result};
use megatron_cpu::CpuBackend;
use std::path::Path;
use std::time::Duration;

/// Runs `save` on every rank of a tp=2, dp=2 world; `break_rank` corrupts that rank's input.
fn save_tp2_dp2(dir: &Path, break_rank: Option<usize>) -> Vec<Result<std::path::PathBuf>> {
    let grid = RankGrid::new(4, 2, 1, 1).unwrap();
    // Ranks as threads over the real `local` communicator.
    let comms = LocalCommunicator::world(4, Duration::from_secs(60));
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                s.spawn(move || {
                    let b = CpuBackend::new();
                    let ctx = grid.context(rank, comm);
                    let ps = params(&b, ctx.tp_rank, 2, false);
                    let mut opt = optimizer_state(&b, &ps);
                    if break_rank == Some(rank) {
                        opt.tensors[0].0 = "bogus.exp_avg".into();
                    }
                    let meta = CheckpointMeta { consumed_train_samples: 42, ..Default::default() };
                    save(dir, 10, &refs(&ps), Some(opt), meta, &b, &ctx)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn tp2_dp2_save_loads_into_any_tp_layout() {
    let tmp = tempfile::tempdir().unwrap();
    for r in save_tp2_dp2(tmp.path(), None) {
        assert_eq!(r.unwrap(), tmp.path().join("iter_0000010"));
    }
    let mut files: Vec<String> = std::fs::read_dir(tmp.path().join("iter_0000010"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into())
        .collect();
    files.sort();
    assert_eq!(files, ["metadata.json", "model_tp00_pp000.safetensors", "model_tp01_pp000.safetensors"]);

    let ck = load(tmp.path(), None).unwrap();
    assert_eq!(ck.metadata.meta.consumed_train_samples, 42);
    assert_eq!((ck.metadata.parallel.tp, ck.metadata.parallel.dp), (2, 2));
    let proj = &ck.metadata.tensors["decoder.layers.0.self_attention.linear_proj.weight"];
    assert_eq!(proj.shards.len(), 2);
    assert_eq!(proj.shards[1].offset, [0, 3]);
    // Replicated parameters are stored once, by TP rank 0.
    let ln = &ck.metadata.tensors["optimizer.decoder.final_layernorm.weight.exp_avg"];
    assert_eq!(ln.shards.len(), 1);
    assert_eq!(ln.shards[0].file, "model_tp00_pp000.safetensors");

    let b = CpuBackend::new();
    for (tp_rank, tp_size) in [(0, 1), (0, 2), (1, 2)] {
        let mut ps = params(&b, tp_rank, tp_size, true);
        ck.load_params(&mut muts(&mut ps), &b).unwrap();
        assert_params_hold_truth(&b, &ps);
        assert_optimizer_holds_truth(&b, &ps, &ck.optimizer_state(&refs(&ps), &b).unwrap());
    }
}

#[test]
fn a_failing_rank_fails_every_rank_and_commits_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let results = save_tp2_dp2(tmp.path(), Some(1));
    for (rank, r) in results.iter().enumerate() {
        let err = format!("{:#}", r.as_ref().err().unwrap_or_else(|| panic!("rank {rank} succeeded")));
        assert!(err.contains("rank 1") && err.contains("bogus.exp_avg"), "rank {rank}: {err}");
    }
    assert_eq!(read_tracker(tmp.path()).unwrap(), None);
    assert!(!tmp.path().join("iter_0000010").exists());
}
