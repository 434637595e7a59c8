//! What a legacy Megatron-LM checkpoint becomes in megatron-rs (the `megatron` package writes
//! it with the native checkpoint crate): full tensors (vocabulary
//! re-padded by Megatron's saver rule: trim, or replicate the last row), the stored `args`
//! as the run's args, iteration, consumed-sample counters and the LR-scheduler state
//! (`opt_param_scheduler` has exactly the fields megatron-rs's schedule stores).

use crate::legacy::LegacyCheckpoint;
use crate::optim_read::FullOptimizerState;
use crate::torchzip::TensorData;
use crate::value::{TorchDType, Value};
use anyhow::{bail, Context, Result};
use half::{bf16, f16};
use megatron_core::HostBuffer;
use serde_json::json;
use std::collections::BTreeMap;

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

/// The run state a converted checkpoint carries besides its tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct RunState {
    pub iteration: u64,
    pub consumed_train_samples: u64,
    pub skipped_train_samples: u64,
    pub consumed_valid_samples: u64,
    /// [`native_args`] of the stored args.
    pub args: serde_json::Value,
    /// The OptimizerParamScheduler state (same fields as megatron-rs's), or null.
    pub lr_scheduler: serde_json::Value,
    pub seed: Option<i64>,
    pub num_floating_point_operations_so_far: f64,
}

/// The [`RunState`] of `ck`, with the vocabulary padded to `padded_vocab`.
pub fn run_state(ck: &LegacyCheckpoint, padded_vocab: usize) -> RunState {
    run_state_from(&ck.args, ck.iteration(), &ck.shards[0][0].root, padded_vocab)
}

/// The [`RunState`] of a checkpoint whose top-level (or common) state dict is `root`.
pub fn run_state_from(args: &Value, iteration: u64, root: &Value, padded_vocab: usize) -> RunState {
    let int = |k: &str| args.get(k).and_then(Value::as_i64).unwrap_or(0).max(0) as u64;
    let sched = root.get("opt_param_scheduler").or_else(|| root.get("lr_scheduler"));
    RunState {
        iteration,
        consumed_train_samples: int("consumed_train_samples"),
        skipped_train_samples: int("skipped_train_samples"),
        consumed_valid_samples: int("consumed_valid_samples"),
        args: native_args(args, padded_vocab),
        lr_scheduler: sched.map(Value::to_json).unwrap_or(serde_json::Value::Null),
        seed: args.get("seed").and_then(Value::as_i64),
        num_floating_point_operations_so_far: root
            .get("num_floating_point_operations_so_far")
            .and_then(Value::as_f64)
            .unwrap_or(0.0),
    }
}

/// `tensors` with the vocabulary tensors at `padded_vocab` rows.
pub fn repad(mut tensors: BTreeMap<String, TensorData>, padded_vocab: usize) -> Result<BTreeMap<String, TensorData>> {
    for name in ["embedding.word_embeddings.weight", "output_layer.weight"] {
        if let Some(t) = tensors.get(name) {
            let resized = resize_vocab(t, padded_vocab).with_context(|| format!("tensor `{name}`"))?;
            tensors.insert(name.to_string(), resized);
        }
    }
    Ok(tensors)
}

/// The optimizer tensors of `full` as megatron-rs names them (`{param}.{state}`), vocabulary
/// tensors' states at `padded_vocab` rows like their parameters.
pub fn optimizer_tensors(full: &FullOptimizerState, padded_vocab: usize) -> Result<Vec<(String, TensorData)>> {
    let mut out = Vec::with_capacity(full.tensors.len());
    for ((param, state), t) in &full.tensors {
        let t = if matches!(param.as_str(), "embedding.word_embeddings.weight" | "output_layer.weight") {
            resize_vocab(t, padded_vocab).with_context(|| format!("optimizer `{param}.{state}`"))?
        } else {
            t.clone()
        };
        out.push((format!("{param}.{state}"), t));
    }
    Ok(out)
}
