//! Single-rank save → load of parameters, optimizer state and run metadata, the on-disk
//! layout, and loading into a different tensor-parallel layout.

mod common;

use common::*;
use megatron_checkpoint::{load, read_tracker, save, CheckpointMeta};
use megatron_core::{DType, ElementwiseOps, HostBuffer, MemoryOps, ParallelContext, Param};
use megatron_cpu::CpuBackend;

fn meta() -> CheckpointMeta {
    CheckpointMeta {
        consumed_train_samples: 800,
        skipped_train_samples: 0,
        consumed_valid_samples: 64,
        args: serde_json::json!({"hidden_size": 4, "num_layers": 1}),
        lr_scheduler: serde_json::json!({"num_steps": 800, "max_lr": 3e-4}),
        rng: serde_json::json!({"seed": 1234}),
        tokenizer_fingerprint: Some("gpt2-bpe:abc123".into()),
        num_floating_point_operations_so_far: 1.5e12,
    }
}

#[test]
fn params_optimizer_and_metadata_round_trip() {
    let b = CpuBackend::new();
    let ctx = ParallelContext::single();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("save");
    let saved = params(&b, 0, 1, false);
    let opt = optimizer_state(&b, &saved);

    let out = save(&dir, 100, &refs(&saved), Some(opt), meta(), &b, &ctx).unwrap();
    assert_eq!(out, dir.join("iter_0000100"));
    assert_eq!(std::fs::read_to_string(dir.join("latest_checkpointed_iteration.txt")).unwrap(), "100");
    assert_eq!(read_tracker(&dir).unwrap(), Some(100));
    let mut files: Vec<String> =
        std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
    files.sort();
    assert_eq!(files, ["metadata.json", "model_tp00_pp000.safetensors"]);
    let entries: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
    assert_eq!(entries.len(), 2, "no leftovers besides the tracker and iter dir: {entries:?}");

    // metadata.json has the documented top-level fields.
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("metadata.json")).unwrap()).unwrap();
    assert_eq!(m["format"], "megatron-rs");
    assert_eq!(m["format_version"], 1);
    assert_eq!(m["iteration"], 100);
    assert_eq!(m["consumed_train_samples"], 800);
    assert_eq!(m["optimizer"]["steps"], 3);
    assert_eq!(m["parallel"], serde_json::json!({"tp": 1, "pp": 1, "dp": 1, "cp": 1}));
    let qkv = &m["tensors"]["decoder.layers.0.self_attention.linear_qkv.weight"];
    assert_eq!(qkv["global_shape"], serde_json::json!([12, 4]));
    assert_eq!(
        qkv["shards"][0],
        serde_json::json!({"file": "model_tp00_pp000.safetensors", "offset": [0, 0], "shape": [12, 4]})
    );
    assert!(m["tensors"]["optimizer.decoder.final_layernorm.weight.exp_avg_sq"].is_object());

    let ck = load(&dir, None).unwrap();
    assert_eq!(ck.iteration(), 100);
    assert_eq!(ck.metadata.meta, meta());
    let mut fresh = params(&b, 0, 1, true);
    ck.load_params(&mut muts(&mut fresh), &b).unwrap();
    assert_params_hold_truth(&b, &fresh);
    let state = ck.optimizer_state(&refs(&fresh), &b).unwrap();
    assert_eq!(state.scalars, serde_json::json!({"steps": 3, "grad_scaler": {"scale": 1.0}}));
    assert_optimizer_holds_truth(&b, &fresh, &state);

    // The whole tensor, assembled.
    let (data, shape) = ck.tensor("decoder.layers.0.self_attention.linear_proj.weight").unwrap();
    assert_eq!(shape, [4, 6]);
    assert_eq!(data, HostBuffer::F32(global_values(&[4, 6], 4)));
}

#[test]
fn loads_into_another_tensor_parallel_layout() {
    let b = CpuBackend::new();
    let tmp = tempfile::tempdir().unwrap();
    let ps = params(&b, 0, 1, false);
    save(tmp.path(), 5, &refs(&ps), Some(optimizer_state(&b, &ps)), meta(), &b, &ParallelContext::single()).unwrap();
    let ck = load(tmp.path(), Some(5)).unwrap();
    for tp_rank in 0..2 {
        let mut shard = params(&b, tp_rank, 2, true);
        ck.load_params(&mut muts(&mut shard), &b).unwrap();
        assert_params_hold_truth(&b, &shard);
        let state = ck.optimizer_state(&refs(&shard), &b).unwrap();
        assert_optimizer_holds_truth(&b, &shard, &state);
    }
}

#[test]
fn bf16_params_round_trip_and_convert_to_fp32() {
    let b = CpuBackend::new();
    let tmp = tempfile::tempdir().unwrap();
    let vals: Vec<f32> = (0..6).map(|i| i as f32 * 0.25 - 0.5).collect();
    let host = HostBuffer::BF16(vals.iter().map(|&v| megatron_core::half::bf16::from_f32(v)).collect());
    let layout = layout(&[2, 3], None, 0, 1);
    let p = Param {
        name: "w".into(),
        value: b.from_host(host.clone(), &[2, 3]).unwrap(),
        grad: b.zeros(&[2, 3], DType::F32).unwrap(),
        layout: layout.clone(),
    };
    save(tmp.path(), 1, &[&p], None, CheckpointMeta::default(), &b, &ParallelContext::single()).unwrap();
    let ck = load(tmp.path(), None).unwrap();
    assert_eq!(ck.tensor("w").unwrap().0, host);
    let mut q = Param {
        name: "w".into(),
        value: b.zeros(&[2, 3], DType::F32).unwrap(),
        grad: b.zeros(&[2, 3], DType::F32).unwrap(),
        layout,
    };
    ck.load_params(&mut [&mut q], &b).unwrap();
    // These values are exact in bf16, so the conversion is exact.
    assert_eq!(host_f32(&b, &q.value), vals);
    assert!(!ck.has_optimizer_state());
    let err = ck.optimizer_state(&[&q], &b).err().unwrap().to_string();
    assert!(err.contains("without optimizer state") && err.contains("--no-load-optim"), "{err}");
}

#[test]
fn resaving_an_iteration_replaces_it() {
    let b = CpuBackend::new();
    let tmp = tempfile::tempdir().unwrap();
    let ctx = ParallelContext::single();
    let ps = params(&b, 0, 1, false);
    save(tmp.path(), 100, &refs(&ps), None, meta(), &b, &ctx).unwrap();
    let mut scaled = params(&b, 0, 1, false);
    b.scale(&mut scaled[0].value, 2.0).unwrap();
    save(tmp.path(), 100, &refs(&scaled), None, meta(), &b, &ctx).unwrap();
    let ck = load(tmp.path(), None).unwrap();
    let (data, _) = ck.tensor(&scaled[0].name).unwrap();
    assert_eq!(data.to_f32_vec(), host_f32(&b, &scaled[0].value));
    assert!(!tmp.path().join("iter_0000100.replaced").exists());
    assert!(!tmp.path().join("iter_0000100.tmp").exists());
}
