//! Legacy Megatron-LM checkpoint → megatron-rs native checkpoint: full tensors (vocabulary
//! re-padded by Megatron's saver rule: trim, or replicate the last row), the stored `args`
//! as the run's args, iteration, consumed-sample counters and the LR-scheduler state
//! (`opt_param_scheduler` has exactly the fields megatron-rs's schedule stores).

use crate::legacy::LegacyCheckpoint;
use crate::torchzip::TensorData;
use crate::value::{TorchDType, Value};
use anyhow::{bail, Context, Result};
use half::{bf16, f16};
use megatron_checkpoint::CheckpointMeta;
use megatron_core::{Backend, DType, HostBuffer, ParallelContext, Param, ParamLayout};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `t` with `rows` rows: trimmed, or padded by repeating its last row (Megatron's saver).
pub fn resize_vocab(t: &TensorData, rows: usize) -> Result<TensorData> {
    let [have, cols] = t.shape[..] else { bail!("a vocabulary tensor must be 2-D, got {:?}", t.shape) };
    if have == 0 {
        bail!("empty vocabulary tensor");
    }
    let row = cols * t.dtype.size();
    let mut bytes = t.bytes[..row * have.min(rows)].to_vec();
    while bytes.len() < rows * row {
        bytes.extend_from_slice(&t.bytes[(have - 1) * row..have * row]);
    }
    Ok(TensorData { dtype: t.dtype, shape: vec![rows, cols], bytes })
}

/// A host buffer of `t` in a dtype megatron-rs stores (f64 and integers become f32).
pub fn host_buffer(t: &TensorData) -> HostBuffer {
    let b = &t.bytes;
    match t.dtype {
        TorchDType::BF16 => HostBuffer::BF16(b.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]])).collect()),
        TorchDType::F16 => HostBuffer::F16(b.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]])).collect()),
        _ => HostBuffer::F32(t.to_f32()),
    }
}

/// The run args megatron-rs keeps for a converted checkpoint: Megatron's Namespace as JSON,
/// with defaults Megatron fills in made implicit again so shape checks compare like with like.
pub fn native_args(args: &Value, padded_vocab: usize) -> serde_json::Value {
    let mut a = args.to_json();
    if let Some(m) = a.as_object_mut() {
        let h = m.get("hidden_size").and_then(|v| v.as_u64()).unwrap_or(0);
        let np = m.get("num_attention_heads").and_then(|v| v.as_u64()).unwrap_or(1).max(1);
        if m.get("kv_channels").and_then(|v| v.as_u64()) == Some(h / np) {
            m.insert("kv_channels".into(), json!(null));
        }
        if m.get("group_query_attention").and_then(|v| v.as_bool()) != Some(true) {
            m.insert("num_query_groups".into(), json!(null));
        }
        m.insert("padded_vocab_size".into(), json!(padded_vocab));
        m.insert("model".into(), json!("gpt"));
        m.insert("imported_from".into(), json!("megatron-lm legacy torch checkpoint"));
    }
    a
}

/// Full tensors of `ck` with the vocabulary at `padded_vocab` rows.
pub fn model_tensors(
    ck: &LegacyCheckpoint,
    padded_vocab: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<BTreeMap<String, TensorData>> {
    let mut tensors = ck.full_tensors(progress)?;
    for name in ["embedding.word_embeddings.weight", "output_layer.weight"] {
        if let Some(t) = tensors.get(name) {
            let resized = resize_vocab(t, padded_vocab).with_context(|| format!("tensor `{name}`"))?;
            tensors.insert(name.to_string(), resized);
        }
    }
    Ok(tensors)
}

/// Writes `ck` as a native checkpoint under `save` (at its iteration) and returns the
/// iteration directory. `padded_vocab`: rows of the word embedding (default: as stored).
pub fn convert_to_native(
    ck: &LegacyCheckpoint,
    save: &Path,
    padded_vocab: Option<usize>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<PathBuf> {
    let padded = padded_vocab.unwrap_or(ck.shape.padded_vocab);
    let tensors = model_tensors(ck, padded, progress)?;
    let backend = megatron_cpu::CpuBackend::new();
    let mut params = Vec::with_capacity(tensors.len());
    for (name, t) in &tensors {
        let value = backend.from_host(host_buffer(t), &t.shape)?;
        let grad = backend.zeros(&[0], DType::F32)?;
        let layout = ParamLayout::replicated(&t.shape, t.shape.len() == 1);
        params.push(Param { name: name.clone(), value, grad, layout });
    }
    let root = &ck.shards[0][0].root;
    let int = |k: &str| ck.args.get(k).and_then(Value::as_i64).unwrap_or(0).max(0) as u64;
    let seed = ck.args.get("seed").and_then(Value::as_i64);
    let meta = CheckpointMeta {
        consumed_train_samples: int("consumed_train_samples"),
        skipped_train_samples: int("skipped_train_samples"),
        consumed_valid_samples: int("consumed_valid_samples"),
        args: native_args(&ck.args, padded),
        lr_scheduler: ck.scheduler_state().map(Value::to_json).unwrap_or(serde_json::Value::Null),
        rng: seed.map_or(serde_json::Value::Null, |s| json!({ "seed": s })),
        tokenizer_fingerprint: None,
        num_floating_point_operations_so_far: root
            .get("num_floating_point_operations_so_far")
            .and_then(Value::as_f64)
            .unwrap_or(0.0),
    };
    let refs: Vec<&Param> = params.iter().collect();
    megatron_checkpoint::save(save, ck.iteration(), &refs, None, meta, &backend, &ParallelContext::single())
        .with_context(|| format!("writing the converted checkpoint to {}", save.display()))
}
