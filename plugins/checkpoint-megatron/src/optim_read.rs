//! The optimizer state of a legacy Megatron-LM checkpoint (SPEC §7.2 `optimizer`), read into
//! full tensors under megatron-rs names.
//!
//! Megatron stores, per model-parallel rank, its wrapper's state dict: `FP32Optimizer` gives
//! torch's own `{state: {i: {step, exp_avg, exp_avg_sq}}, param_groups: [{…, params: [i…]}]}`;
//! `Float16OptimizerWithFloat16Params` (bf16/fp16 runs) wraps that as `{optimizer: …,
//! grad_scaler: …, fp32_from_fp16_params: [[main param per group entry]…]}`. Torch numbers the
//! parameters by walking the param groups in order, and Megatron fills each group with the
//! rank's `named_parameters()` in module order, split by weight decay (biases and 1-D tensors
//! get `wd_mult` 0). The `model` state dict lists the same parameters in the same module order,
//! so index `i` is recovered from the state dict keys and each group's `wd_mult` — and checked:
//! group sizes must match, and every moment must have its parameter's shape.

use crate::legacy::{model_chunks, LegacyCheckpoint};
use crate::partition::{local_to_global, merge};
use crate::torchzip::{TensorData, TorchFile};
use crate::value::Value;
use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeMap;

/// Per-parameter state names, as megatron-rs's Adam and mixed-precision wrapper call them.
pub const EXP_AVG: &str = "exp_avg";
pub const EXP_AVG_SQ: &str = "exp_avg_sq";
pub const MAIN_PARAM: &str = "main_param";

/// A legacy checkpoint's optimizer state, reassembled to full tensors.
#[derive(Debug)]
pub struct FullOptimizerState {
    /// Steps taken (torch's per-parameter `step`, the same for every parameter).
    pub step: u64,
    /// `(param name, state name)` → full tensor (`exp_avg`, `exp_avg_sq`, `main_param`).
    pub tensors: BTreeMap<(String, String), TensorData>,
    /// Megatron's `grad_scaler` state (fp16 runs), as JSON.
    pub grad_scaler: Option<serde_json::Value>,
    /// The first rank's param groups without their `params` (hyper-parameters), as JSON.
    pub param_groups: Vec<serde_json::Value>,
}

/// Weight-decay-free parameters by Megatron's default rule: biases and 1-D tensors.
pub fn no_weight_decay(local_name: &str, shape: &[usize]) -> bool {
    shape.len() == 1 || local_name.ends_with(".bias")
}

/// The rank's model parameters in module order: `(chunk, local name, shape)`.
fn rank_params(file: &TorchFile) -> Result<Vec<(usize, String, Vec<usize>)>> {
    let mut out = Vec::new();
    for (chunk, model) in model_chunks(&file.root, file.path())? {
        for (k, v) in model.items().unwrap_or(&[]) {
            let (Value::Str(key), Value::Tensor(t)) = (k, v) else { continue };
            if key.ends_with("_extra_state") {
                continue;
            }
            out.push((chunk, key.clone(), t.shape.iter().map(|&d| d as usize).collect()));
        }
    }
    Ok(out)
}

/// The torch optimizer dict, the wrapper around it (if any) of one rank.
fn torch_state(root: &Value, path: &str) -> Result<Option<(Value, Option<Value>)>> {
    let Some(opt) = root.get("optimizer") else { return Ok(None) };
    let opt = match opt {
        Value::List(v) if v.len() == 1 => &v[0],
        Value::List(v) => bail!(
            "{path}: `optimizer` holds {} chained optimizers (expert or multiple model-chunk optimizers); \
             megatron-rs reads one",
            v.len()
        ),
        Value::None => return Ok(None),
        o => o,
    };
    if opt.get("state").is_some() && opt.get("param_groups").is_some() {
        return Ok(Some((opt.clone(), None)));
    }
    match opt.get("optimizer") {
        Some(inner) if inner.get("param_groups").is_some() => Ok(Some((inner.clone(), Some(opt.clone())))),
        _ => bail!(
            "{path}: `optimizer` is neither torch's state dict (state, param_groups) nor Megatron's fp16 wrapper \
             (optimizer, fp32_from_fp16_params); a distributed-optimizer checkpoint keeps its state in \
             distrib_optim.pt, which megatron-rs does not read"
        ),
    }
}

/// The indices of `group` (its `params` list).
fn group_indices(group: &Value, path: &str) -> Result<Vec<i64>> {
    group
        .get("params")
        .and_then(Value::elements)
        .ok_or_else(|| anyhow!("{path}: an optimizer param group has no `params` list"))?
        .iter()
        .map(|v| v.as_i64().ok_or_else(|| anyhow!("{path}: a param group index is a {}", v.kind())))
        .collect()
}

/// Reads every rank's optimizer state; `None` when the checkpoint has none.
pub fn read_optimizer(ck: &LegacyCheckpoint) -> Result<Option<FullOptimizerState>> {
    let tp = ck.shape.tp;
    let mut parts: BTreeMap<(String, String), Vec<Option<TensorData>>> = BTreeMap::new();
    let mut step: Option<u64> = None;
    let mut grad_scaler = None;
    let mut param_groups = Vec::new();
    let mut ranks_with_state = 0;
    for (pp_rank, row) in ck.shards.iter().enumerate() {
        for (tp_rank, file) in row.iter().enumerate() {
            let path = file.path().display().to_string();
            let Some((torch, wrapper)) = torch_state(&file.root, &path)? else { continue };
            ranks_with_state += 1;
            let params = rank_params(file)?;
            let groups = torch
                .get("param_groups")
                .and_then(Value::elements)
                .ok_or_else(|| anyhow!("{path}: optimizer `param_groups` is not a list"))?;
            if pp_rank == 0 && tp_rank == 0 {
                param_groups = groups
                    .iter()
                    .map(|g| {
                        let mut j = g.to_json();
                        if let Some(m) = j.as_object_mut() {
                            m.remove("params");
                        }
                        j
                    })
                    .collect();
                grad_scaler = wrapper.as_ref().and_then(|w| w.get("grad_scaler")).map(Value::to_json);
            }
            // index -> (param, position in its group, group number)
            let mut owner: BTreeMap<i64, (usize, usize, usize)> = BTreeMap::new();
            let wd_free: Vec<bool> = params.iter().map(|(_, n, s)| no_weight_decay(n, s)).collect();
            let mut kinds_seen = [false, false];
            for (g, group) in groups.iter().enumerate() {
                let idx = group_indices(group, &path)?;
                if idx.is_empty() {
                    continue;
                }
                let zero_wd = group.get("wd_mult").and_then(Value::as_f64).map(|w| w == 0.0);
                let single = groups
                    .iter()
                    .filter(|g| g.get("params").and_then(Value::elements).is_some_and(|p| !p.is_empty()))
                    .count()
                    == 1;
                let members: Vec<usize> = match zero_wd {
                    // One group (no weight-decay split configured): every parameter.
                    _ if single => (0..params.len()).collect(),
                    Some(z) => (0..params.len()).filter(|&p| wd_free[p] == z).collect(),
                    None => bail!("{path}: param group {g} has no `wd_mult`; cannot tell which parameters it holds"),
                };
                let class = usize::from(zero_wd.unwrap_or(false));
                if std::mem::replace(&mut kinds_seen[class], true) {
                    bail!(
                        "{path}: two optimizer param groups hold {} parameters (groups split by lr_mult, decoupled \
                         LR or expert parallelism are not supported)",
                        if class == 1 { "weight-decay-free" } else { "weight-decayed" }
                    );
                }
                if members.len() != idx.len() {
                    bail!(
                        "{path}: optimizer param group {g} lists {} parameters, the model state dict has {} that \
                         belong in it (wd_mult {:?}): the optimizer and model do not match",
                        idx.len(),
                        members.len(),
                        group.get("wd_mult").and_then(Value::as_f64)
                    );
                }
                for (pos, (&i, &p)) in idx.iter().zip(&members).enumerate() {
                    if owner.insert(i, (p, pos, g)).is_some() {
                        bail!("{path}: optimizer index {i} appears in two param groups");
                    }
                }
            }
            let state = torch.get("state").and_then(Value::items).unwrap_or(&[]);
            let mains =
                wrapper.as_ref().and_then(|w| w.get("fp32_from_fp16_params").or_else(|| w.get("fp32_from_fp16")));
            let mut put = |p: usize, state_name: &str, t: &TensorData| -> Result<()> {
                let (chunk, local, shape) = &params[p];
                if &t.shape != shape {
                    bail!(
                        "{path}: optimizer `{state_name}` of `{local}` has shape {:?}, the parameter {shape:?}",
                        t.shape
                    );
                }
                let Some(name) = local_to_global(local, &ck.shape, pp_rank, *chunk)
                    .with_context(|| format!("{path}: tensor `{local}`"))?
                else {
                    return Ok(()); // the last stage's copy of a tied embedding
                };
                let slot = parts.entry((name, state_name.to_string())).or_insert_with(|| vec![None; tp]);
                slot[tp_rank] = Some(t.clone());
                Ok(())
            };
            for (k, v) in state {
                let i = k.as_i64().ok_or_else(|| anyhow!("{path}: optimizer state key is a {}", k.kind()))?;
                let &(p, _, _) =
                    owner.get(&i).ok_or_else(|| anyhow!("{path}: optimizer state {i} is in no param group"))?;
                let s = match v.get("step") {
                    Some(Value::Tensor(t)) => file.tensor(t, "step")?.to_f32().first().map(|&x| x as u64),
                    Some(other) => other.as_f64().map(|x| x as u64),
                    None => None,
                }
                .ok_or_else(|| anyhow!("{path}: optimizer state {i} has no numeric `step`"))?;
                if *step.get_or_insert(s) != s {
                    bail!("{path}: parameters have taken different numbers of steps ({s} vs {step:?})");
                }
                for state_name in [EXP_AVG, EXP_AVG_SQ] {
                    let Some(Value::Tensor(t)) = v.get(state_name) else {
                        bail!("{path}: optimizer state {i} has no `{state_name}` tensor (only Adam is supported)")
                    };
                    put(p, state_name, &file.tensor(t, state_name)?)?;
                }
            }
            if let Some(mains) = mains {
                let mains = mains.elements().ok_or_else(|| anyhow!("{path}: fp32_from_fp16_params is not a list"))?;
                for (i, &(p, pos, g)) in &owner {
                    let t = mains.get(g).and_then(Value::elements).and_then(|v| v.get(pos));
                    match t {
                        Some(Value::Tensor(t)) => put(p, MAIN_PARAM, &file.tensor(t, "fp32_from_fp16_params")?)?,
                        _ => bail!("{path}: fp32_from_fp16_params has no tensor for optimizer index {i}"),
                    }
                }
            }
        }
    }
    if ranks_with_state == 0 {
        return Ok(None);
    }
    if ranks_with_state != tp * ck.shards.len() {
        bail!(
            "{}: only {ranks_with_state} of {} ranks hold optimizer state",
            ck.iter_dir.display(),
            tp * ck.shards.len()
        );
    }
    let mut tensors = BTreeMap::new();
    for (key, shards) in parts {
        let shards: Vec<TensorData> = shards
            .into_iter()
            .enumerate()
            .map(|(r, s)| s.ok_or_else(|| anyhow!("optimizer `{}.{}` is missing from tp rank {r}", key.0, key.1)))
            .collect::<Result<_>>()?;
        let full = merge(&key.0, shards, &ck.shape).with_context(|| format!("optimizer `{}.{}`", key.0, key.1))?;
        tensors.insert(key, full);
    }
    Ok(Some(FullOptimizerState { step: step.unwrap_or(0), tensors, grad_scaler, param_groups }))
}
