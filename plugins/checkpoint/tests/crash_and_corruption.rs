//! Crash leftovers, the tracker, damaged files and model/checkpoint mismatches: each must give
//! either the previous checkpoint or an error that names the file or tensor at fault.

mod common;

use common::*;
use megatron_checkpoint::{load, read_tracker, save, CheckpointMeta};
use megatron_core::{MemoryOps, ParallelContext};
use megatron_cpu::CpuBackend;
use std::path::Path;

fn save_iter(dir: &Path, iteration: u64) {
    let b = CpuBackend::new();
    let ps = params(&b, 0, 1, false);
    let opt = optimizer_state(&b, &ps);
    save(dir, iteration, &refs(&ps), Some(opt), CheckpointMeta::default(), &b, &ParallelContext::single()).unwrap();
}

fn load_err(dir: &Path) -> String {
    format!("{:#}", load(dir, None).err().expect("load should fail"))
}

#[test]
fn tracker_missing_then_latest() {
    let tmp = tempfile::tempdir().unwrap();
    assert_eq!(read_tracker(tmp.path()).unwrap(), None);
    let err = load_err(tmp.path());
    assert!(err.contains("latest_checkpointed_iteration.txt is missing"), "{err}");
    save_iter(tmp.path(), 100);
    save_iter(tmp.path(), 200);
    assert_eq!(read_tracker(tmp.path()).unwrap(), Some(200));
    assert_eq!(load(tmp.path(), None).unwrap().iteration(), 200);
    assert_eq!(load(tmp.path(), Some(100)).unwrap().iteration(), 100);
    let err = format!("{:#}", load(tmp.path(), Some(300)).err().unwrap());
    assert!(err.contains("iter_0000300") && err.contains("[100, 200]"), "{err}");
}

#[test]
fn crash_mid_save_leaves_previous_checkpoint_and_next_save_cleans_up() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    save_iter(dir, 100);
    // A save of 200 killed half way: partial shard, no metadata, tracker untouched.
    let partial = dir.join("iter_0000200.tmp");
    std::fs::create_dir(&partial).unwrap();
    let good = std::fs::read(dir.join("iter_0000100/model_tp00_pp000.safetensors")).unwrap();
    std::fs::write(partial.join("model_tp00_pp000.safetensors"), &good[..good.len() / 2]).unwrap();
    std::fs::write(dir.join("latest_checkpointed_iteration.txt.tmp"), "2").unwrap();

    let ck = load(dir, None).unwrap();
    assert_eq!(ck.iteration(), 100);
    let b = CpuBackend::new();
    let mut fresh = params(&b, 0, 1, true);
    ck.load_params(&mut muts(&mut fresh), &b).unwrap();
    assert_params_hold_truth(&b, &fresh);

    save_iter(dir, 300);
    assert!(!partial.exists(), "stale tmp dir removed by the next save");
    assert!(!dir.join("latest_checkpointed_iteration.txt.tmp").exists());
    assert_eq!(load(dir, None).unwrap().iteration(), 300);
}

#[test]
fn crash_while_replacing_the_tracked_iteration_falls_back_to_the_old_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    save_iter(dir, 100);
    // Killed after moving the old copy aside, before the new one was renamed into place.
    std::fs::rename(dir.join("iter_0000100"), dir.join("iter_0000100.replaced")).unwrap();
    std::fs::create_dir(dir.join("iter_0000100.tmp")).unwrap();
    assert_eq!(load(dir, None).unwrap().iteration(), 100);
    save_iter(dir, 100);
    assert!(dir.join("iter_0000100").is_dir());
    assert!(!dir.join("iter_0000100.replaced").exists());
    assert!(!dir.join("iter_0000100.tmp").exists());
}

#[test]
fn truncated_or_missing_shard_file_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    save_iter(tmp.path(), 7);
    let shard = tmp.path().join("iter_0000007/model_tp00_pp000.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 10]).unwrap();
    let err = load_err(tmp.path());
    assert!(err.contains("model_tp00_pp000.safetensors") && err.contains("corrupted or truncated"), "{err}");

    // A damaged header.
    let mut bad = bytes.clone();
    bad[10] = b'!';
    std::fs::write(&shard, &bad).unwrap();
    let err = load_err(tmp.path());
    assert!(err.contains("corrupted or truncated"), "{err}");

    std::fs::remove_file(&shard).unwrap();
    let err = load_err(tmp.path());
    assert!(err.contains("model_tp00_pp000.safetensors") && err.contains("missing"), "{err}");
}

#[test]
fn damaged_metadata_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    save_iter(tmp.path(), 7);
    let path = tmp.path().join("iter_0000007/metadata.json");
    let good: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();

    std::fs::write(&path, "{\"format\": \"megatron-rs\", \"format_ver").unwrap();
    let err = load_err(tmp.path());
    assert!(err.contains("metadata.json") && err.contains("not valid JSON"), "{err}");

    let mut v = good.clone();
    v["format_version"] = 9.into();
    std::fs::write(&path, v.to_string()).unwrap();
    let err = load_err(tmp.path());
    assert!(err.contains("format version 9") && err.contains("reads only version 1"), "{err}");

    // Metadata disagreeing with the safetensors header.
    let mut v = good.clone();
    v["tensors"]["decoder.final_layernorm.weight"]["dtype"] = "BF16".into();
    std::fs::write(&path, v.to_string()).unwrap();
    let err = load_err(tmp.path());
    assert!(err.contains("decoder.final_layernorm.weight") && err.contains("metadata.json says BF16"), "{err}");

    let mut v = good.clone();
    v["tensors"]["decoder.final_layernorm.weight"]["shards"][0]["shape"] = serde_json::json!([2]);
    std::fs::write(&path, v.to_string()).unwrap();
    let err = load_err(tmp.path());
    assert!(err.contains("is F32 [4], but metadata.json says F32 [2]"), "{err}");

    let mut v = good.clone();
    v["tensors"]["decoder.final_layernorm.weight"]["global_shape"] = serde_json::json!([8]);
    std::fs::write(&path, v.to_string()).unwrap();
    let err = load_err(tmp.path());
    assert!(err.contains("decoder.final_layernorm.weight") && err.contains("cover 4 of 8"), "{err}");

    std::fs::remove_file(&path).unwrap();
    let err = load_err(tmp.path());
    assert!(err.contains("metadata.json") && err.contains("incomplete"), "{err}");
}

#[test]
fn shape_mismatch_and_missing_tensor_errors_name_the_tensor() {
    let b = CpuBackend::new();
    let tmp = tempfile::tempdir().unwrap();
    save_iter(tmp.path(), 1);
    let ck = load(tmp.path(), None).unwrap();

    let mut ps = params(&b, 0, 1, true);
    let qkv = &mut ps[1];
    qkv.layout.global_shape = vec![12, 8];
    qkv.value = b.zeros(&[12, 8], megatron_core::DType::F32).unwrap();
    let err = format!("{:#}", ck.load_params(&mut muts(&mut ps), &b).err().unwrap());
    assert!(
        err.contains("decoder.layers.0.self_attention.linear_qkv.weight [12, 4], model expects [12, 8]")
            && err.contains("--hidden-size"),
        "{err}"
    );
    let err = format!("{:#}", ck.optimizer_state(&refs(&ps), &b).err().unwrap());
    assert!(err.contains("optimizer.decoder.layers.0.self_attention.linear_qkv.weight.exp_avg [12, 4]"), "{err}");

    let mut ps = params(&b, 0, 1, true);
    ps[0].name = "decoder.layers.1.mlp.linear_fc1.weight".into();
    let err = format!("{:#}", ck.load_params(&mut muts(&mut ps), &b).err().unwrap());
    assert!(err.contains("no tensor `decoder.layers.1.mlp.linear_fc1.weight`"), "{err}");
}

#[test]
fn optimizer_state_for_an_unknown_parameter_fails_the_save() {
    let b = CpuBackend::new();
    let tmp = tempfile::tempdir().unwrap();
    let ps = params(&b, 0, 1, false);
    let mut opt = optimizer_state(&b, &ps);
    opt.tensors[0].0 = "no.such.param.exp_avg".into();
    let err = format!(
        "{:#}",
        save(tmp.path(), 1, &refs(&ps), Some(opt), CheckpointMeta::default(), &b, &ParallelContext::single())
            .err()
            .unwrap()
    );
    assert!(err.contains("no.such.param.exp_avg"), "{err}");
    assert_eq!(read_tracker(tmp.path()).unwrap(), None, "nothing committed");
    assert!(!tmp.path().join("iter_0000001").exists());
}
