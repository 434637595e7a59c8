//! Saving and restoring per-parameter optimizer state tensors (`"{param}.{state}"`, fp32),
//! shared by Adam and SGD so both check names and shapes the same way.

use anyhow::{anyhow, bail, Result};
use megatron_core::{Backend, DType, DeviceTensor, OptimizerState, Param};
use std::collections::{BTreeMap, HashMap};

/// A backend copy of `t` (checkpoints must not alias live state).
pub(crate) fn clone_tensor(backend: &dyn Backend, t: &DeviceTensor) -> Result<DeviceTensor> {
    let mut out = backend.zeros(t.shape(), t.dtype())?;
    backend.copy(t, &mut out)?;
    Ok(out)
}

/// Per-parameter states, keyed by parameter name, each holding tensors in `kinds` order.
pub(crate) type StateMap = BTreeMap<String, Vec<DeviceTensor>>;

/// Flattens `states` into an [`OptimizerState`] with scalars `{"step": steps}`.
pub(crate) fn save(states: &StateMap, kinds: &[&str], steps: u64, backend: &dyn Backend) -> Result<OptimizerState> {
    let mut tensors = Vec::with_capacity(states.len() * kinds.len());
    for (name, ts) in states {
        for (kind, t) in kinds.iter().zip(ts) {
            tensors.push((format!("{name}.{kind}"), clone_tensor(backend, t)?));
        }
    }
    Ok(OptimizerState { scalars: serde_json::json!({ "step": steps }), tensors })
}

/// Rebuilds the state of `params` from `state`: returns `(steps, states)`. Tensors of params
/// not in `params` are ignored (another pipeline stage owns them); a param with some but not
/// all of its tensors, or with none after step 0, is an error naming the missing tensor.
pub(crate) fn load(
    state: OptimizerState,
    kinds: &[&str],
    optimizer: &str,
    params: &[&Param],
    backend: &dyn Backend,
) -> Result<(u64, StateMap)> {
    let steps = state.scalars.get("step").and_then(|s| s.as_u64()).ok_or_else(|| {
        anyhow!("the {optimizer} optimizer state has no integer `step` scalar (scalars: {})", state.scalars)
    })?;
    let mut by_key: HashMap<String, DeviceTensor> = HashMap::with_capacity(state.tensors.len());
    for (key, t) in state.tensors {
        if !kinds.iter().any(|k| key.strip_suffix(k).is_some_and(|p| p.ends_with('.'))) {
            bail!(
                "optimizer state tensor `{key}` is not a {optimizer} state (expected `<param>.{}`); was the \
                 checkpoint saved with another --optimizer?",
                kinds.join("` or `<param>.")
            );
        }
        by_key.insert(key, t);
    }
    let mut states = StateMap::new();
    for p in params {
        let keys: Vec<String> = kinds.iter().map(|k| format!("{}.{k}", p.name)).collect();
        if steps == 0 && keys.iter().all(|k| !by_key.contains_key(k)) {
            continue; // never stepped: states are created on the first step
        }
        let mut ts = Vec::with_capacity(kinds.len());
        for key in keys {
            let t = by_key.remove(&key).ok_or_else(|| {
                anyhow!(
                    "the {optimizer} optimizer state (step {steps}) has no tensor `{key}` for parameter `{}`; the \
                     checkpoint does not match this model",
                    p.name
                )
            })?;
            if t.shape() != p.value.shape() {
                bail!(
                    "optimizer state tensor `{key}` has shape {:?} but parameter `{}` has shape {:?}; the checkpoint \
                     was saved for a different model or parallel layout",
                    t.shape(),
                    p.name,
                    p.value.shape()
                );
            }
            ts.push(to_f32(backend, t)?);
        }
        states.insert(p.name.clone(), ts);
    }
    Ok((steps, states))
}

/// Optimizer states are kept in fp32 (SPEC §6.5); a checkpoint in another float dtype is cast.
fn to_f32(backend: &dyn Backend, t: DeviceTensor) -> Result<DeviceTensor> {
    if t.dtype() == DType::F32 {
        return Ok(t);
    }
    let mut out = backend.zeros(t.shape(), DType::F32)?;
    backend.cast(&t, &mut out)?;
    Ok(out)
}

/// Checks a live state tensor still fits its parameter (a model must not change shape).
/// The state tensors of `p` in `kinds` order, created as fp32 zeros on its first step (the
/// `bool` says they were just created); their shape is checked against the parameter.
pub(crate) fn get_or_create<'a>(
    states: &'a mut StateMap,
    p: &Param,
    kinds: &[&str],
    backend: &dyn Backend,
) -> Result<(&'a mut [DeviceTensor], bool)> {
    let fresh = !states.contains_key(&p.name);
    if fresh {
        let zeros = kinds.iter().map(|_| backend.zeros(p.value.shape(), DType::F32)).collect::<Result<Vec<_>>>()?;
        states.insert(p.name.clone(), zeros);
    }
    let ts = states.get_mut(&p.name).map(Vec::as_mut_slice).unwrap_or_default();
    if ts.len() != kinds.len() {
        bail!("internal: optimizer state of `{}` holds {} tensors, expected {kinds:?}", p.name, ts.len());
    }
    for (t, kind) in ts.iter().zip(kinds) {
        check_shape(t, p, kind)?;
    }
    Ok((ts, fresh))
}

/// The weight decay applied to `p`: SPEC §6.4 gives biases and 1-D params (norm weights)
/// `wd_mult` 0.
pub(crate) fn decay_for(p: &Param, weight_decay: f64) -> f64 {
    if p.layout.no_weight_decay {
        0.0
    } else {
        weight_decay
    }
}

pub(crate) fn check_shape(t: &DeviceTensor, p: &Param, kind: &str) -> Result<()> {
    if t.shape() != p.value.shape() {
        bail!(
            "optimizer state `{}.{kind}` has shape {:?} but the parameter now has shape {:?}",
            p.name,
            t.shape(),
            p.value.shape()
        );
    }
    Ok(())
}
