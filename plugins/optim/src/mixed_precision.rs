//! [`MixedPrecisionOptimizer`]: fp32 main parameters for a model whose parameters are bf16 or
//! fp16 (Megatron's `Float16OptimizerWithFloat16Params`, SPEC §6.7).
//!
//! The wrapped optimizer (Adam, SGD, the distributed optimizer) only ever sees fp32 "main"
//! parameters: one fp32 copy of every half parameter, made from it on the first step. Each
//! step hands the inner optimizer the main parameters with the model's gradients (fp32
//! buffers are lent without a copy; bf16 ones from `--grad-reduce-in-bf16` are widened into an
//! fp32 buffer), then rounds the updated main parameters back into the model (once, to
//! nearest even). So Adam's moments and the update arithmetic are fp32, and the small updates
//! that a bf16 weight cannot represent accumulate in the main copy instead of being lost.
//!
//! Checkpoints: [`Optimizer::state`] adds each main parameter as the per-parameter state
//! `"{param}.main_param"` (fp32) to the inner state, so a half run resumes bit-identically and
//! an fp32 run can continue from the exact fp32 values ([`take_main_params`]).
//!
//! The distributed optimizer (`--use-distributed-optimizer`) is not wrapped: it keeps the fp32
//! main parameters of its own shard and rounds them itself (see [`crate::DistributedOptimizer`]),
//! so no rank holds a full fp32 copy.

use crate::state_tensors::clone_tensor;
use anyhow::{anyhow, Context, Result};
use megatron_core::{Backend, DType, DeviceTensor, Optimizer, OptimizerState, Param};
use std::collections::BTreeMap;

/// State name of the fp32 main parameter in checkpoints.
pub const MAIN_PARAM: &str = "main_param";

/// Removes the `"{param}.main_param"` tensors from `state` and returns them by parameter name
/// (empty for a state saved by an fp32 run).
pub fn take_main_params(state: &mut OptimizerState) -> BTreeMap<String, DeviceTensor> {
    let suffix = format!(".{MAIN_PARAM}");
    let (main, rest): (Vec<_>, Vec<_>) =
        std::mem::take(&mut state.tensors).into_iter().partition(|(k, _)| k.ends_with(&suffix));
    state.tensors = rest;
    main.into_iter().map(|(k, t)| (k[..k.len() - suffix.len()].to_string(), t)).collect()
}

/// An fp32 main parameter: the same name and layout as the model's, an fp32 value, and the
/// gradient slot the model's gradient is lent into during a step.
struct Main {
    param: Param,
    /// fp32 copy of a half gradient (`--grad-reduce-in-bf16`); unused for fp32 gradients.
    widened: bool,
}

/// See the module doc.
pub struct MixedPrecisionOptimizer {
    inner: Box<dyn Optimizer>,
    main: BTreeMap<String, Main>,
}

impl MixedPrecisionOptimizer {
    pub fn new(inner: Box<dyn Optimizer>) -> MixedPrecisionOptimizer {
        MixedPrecisionOptimizer { inner, main: BTreeMap::new() }
    }

    /// fp32 values held besides the inner optimizer's state (the main parameters).
    pub fn main_numel(&self) -> usize {
        self.main.values().map(|m| m.param.value.numel()).sum()
    }

    fn make_main(p: &Param, value: Option<DeviceTensor>, backend: &dyn Backend) -> Result<Main> {
        let value = match value {
            Some(v) => to_f32(backend, v)?,
            None => to_f32(backend, clone_tensor(backend, &p.value)?)?,
        };
        if value.shape() != p.value.shape() {
            anyhow::bail!(
                "main parameter of `{}` has shape {:?}, the parameter {:?}: the checkpoint was saved for another \
                 model or layout",
                p.name,
                value.shape(),
                p.value.shape()
            );
        }
        let grad = backend.zeros(&[0], DType::F32)?;
        Ok(Main { param: Param { name: p.name.clone(), value, grad, layout: p.layout.clone() }, widened: false })
    }
}

fn to_f32(backend: &dyn Backend, t: DeviceTensor) -> Result<DeviceTensor> {
    if t.dtype() == DType::F32 {
        return Ok(t);
    }
    let mut out = backend.zeros(t.shape(), DType::F32)?;
    backend.cast(&t, &mut out)?;
    Ok(out)
}

impl Optimizer for MixedPrecisionOptimizer {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn step(&mut self, params: &mut [&mut Param], lr: f64, weight_decay: f64, backend: &dyn Backend) -> Result<()> {
        for p in params.iter() {
            if !self.main.contains_key(&p.name) {
                self.main.insert(p.name.clone(), Self::make_main(p, None, backend)?);
            }
        }
        // Lend (fp32) or widen (half) every gradient into its main parameter.
        for p in params.iter_mut() {
            let m = self.main.get_mut(&p.name).ok_or_else(|| anyhow!("no main parameter for `{}`", p.name))?;
            if p.grad.dtype() == DType::F32 {
                std::mem::swap(&mut m.param.grad, &mut p.grad);
                m.widened = false;
            } else {
                if m.param.grad.shape() != p.grad.shape() {
                    m.param.grad = backend.zeros(p.grad.shape(), DType::F32)?;
                }
                backend.cast(&p.grad, &mut m.param.grad)?;
                m.widened = true;
            }
        }
        let names: Vec<String> = params.iter().map(|p| p.name.clone()).collect();
        let result = {
            let mut by_name: BTreeMap<&str, &mut Main> = self.main.iter_mut().map(|(k, v)| (k.as_str(), v)).collect();
            let mut mains: Vec<&mut Param> = Vec::with_capacity(names.len());
            for n in &names {
                let m = by_name.remove(n.as_str()).ok_or_else(|| anyhow!("parameter `{n}` given twice"))?;
                mains.push(&mut m.param);
            }
            self.inner.step(&mut mains, lr, weight_decay, backend)
        };
        // Give the lent gradients back (also on error), then round the main params down.
        for p in params.iter_mut() {
            let m = self.main.get_mut(&p.name).ok_or_else(|| anyhow!("no main parameter for `{}`", p.name))?;
            if !m.widened {
                std::mem::swap(&mut m.param.grad, &mut p.grad);
            }
        }
        result?;
        for p in params.iter_mut() {
            let m = &self.main[&p.name];
            backend
                .cast(&m.param.value, &mut p.value)
                .with_context(|| format!("rounding `{}` to {}", p.name, p.value.dtype()))?;
        }
        Ok(())
    }

    fn steps(&self) -> u64 {
        self.inner.steps()
    }

    fn state(&self, backend: &dyn Backend) -> Result<OptimizerState> {
        let mut s = self.inner.state(backend)?;
        for (name, m) in &self.main {
            s.tensors.push((format!("{name}.{MAIN_PARAM}"), clone_tensor(backend, &m.param.value)?));
        }
        Ok(s)
    }

    /// Restores the inner state and the main parameters; a parameter without a stored main
    /// copy (a state saved by an fp32 run) gets one on its first step from its (loaded) value,
    /// unless the caller put the checkpoint's fp32 weights into `state` as main params.
    fn load_state(&mut self, mut state: OptimizerState, params: &[&Param], backend: &dyn Backend) -> Result<()> {
        let mut stored = take_main_params(&mut state);
        self.inner.load_state(state, params, backend)?;
        self.main.clear();
        for p in params {
            if let Some(v) = stored.remove(&p.name) {
                self.main.insert(p.name.clone(), Self::make_main(p, Some(v), backend)?);
            }
        }
        Ok(())
    }
}
