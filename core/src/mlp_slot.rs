//! The MLP slot of a transformer layer as a plugin kind (`mlp`), Megatron-Core's spec idea
//! where the MLP submodule of a layer is filled by a different module (MoE, issue 17).
//!
//! Why this lives in the core: a plugin library (`--plugin libmegatron_moe.so`) can only hand
//! the host what the core defines, and the host's transformer layers must call it without
//! knowing the plugin. So the core owns the smallest contract that does that — the module
//! trait [`MlpModule`] over core types, what its factory is given ([`MlpEnv`]), and the
//! resolved provider the driver passes to model factories ([`MlpProvider`] in
//! [`crate::registry::ModelEnv`]). Everything MoE-specific stays in the plugin.

use crate::plugin_loader::PanicGuard;
use crate::registry::{with_config, Origin};
use crate::{Backend, DeviceTensor, ParallelContext, Param, Result};
use anyhow::anyhow;
use std::sync::Arc;

/// What an MLP factory gets: where the module sits and the dense MLP's sizes.
#[derive(Clone)]
pub struct MlpEnv {
    pub backend: Arc<dyn Backend>,
    pub ctx: ParallelContext,
    /// Parameter-name prefix of the slot, e.g. `decoder.layers.3.mlp`.
    pub prefix: String,
    /// Global 0-based layer number.
    pub layer_number: usize,
    pub num_layers: usize,
    pub hidden_size: usize,
    /// The dense MLP's inner size (`--ffn-hidden-size`).
    pub ffn_hidden_size: usize,
    pub swiglu: bool,
    /// Biases on the dense linears.
    pub bias: bool,
    pub init_method_std: f32,
    /// `init_method_std / sqrt(2 L)` (output layers).
    pub output_init_std: f32,
    /// Base seed of the parameter initialization.
    pub seed: u64,
    /// Sequence parallelism (tp > 1): the slot's input and output are this TP rank's `(N/tp,
    /// C)` shard of the flattened `(B, T)` tokens, and the gradients of parameters replicated
    /// over TP are summed over the TP group by the model afterwards.
    pub sequence_parallel: bool,
}

/// The microbatch a module runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlpStep {
    pub batch: usize,
    pub seq: usize,
    /// Training forward: keep what backward needs, apply training-only terms (aux losses).
    pub train: bool,
    /// The microbatch's dropout/jitter seed.
    pub seed: u64,
}

/// A module filling an MLP slot: `out (B, T, C) = f(x (B, T, C))`.
pub trait MlpModule: Send {
    /// Overwrites `out (B, T, C)`; in training keeps what backward needs.
    fn forward(&mut self, x: &DeviceTensor, out: &mut DeviceTensor, step: MlpStep) -> Result<()>;
    /// Overwrites `d_x (B, T, C)` from `d_out`; accumulates parameter gradients (and any
    /// auxiliary-loss gradient the module adds itself).
    fn backward(&mut self, x: &DeviceTensor, d_out: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()>;
    /// The tensors the last training forward saved, in a fixed order and number (pipeline
    /// stages swap them out per microbatch).
    fn saved_activations_mut(&mut self) -> Vec<&mut DeviceTensor>;
    fn params(&self) -> Vec<&Param>;
    fn params_mut(&mut self) -> Vec<&mut Param>;
    /// Once per step, after the gradient reduction (e.g. the expert-bias update).
    fn finalize_grads(&mut self) -> Result<()> {
        Ok(())
    }
    /// Named values accumulated since the last call (e.g. `load_balancing_loss`), drained.
    fn take_metrics(&mut self) -> Vec<(String, f64)> {
        Vec::new()
    }
    /// State that is not trained but must survive a checkpoint (Megatron's module buffers, e.g.
    /// the router's expert bias): saved and loaded by name like parameters, never given to the
    /// optimizer (its `grad` is empty).
    fn buffers(&self) -> Vec<&Param> {
        Vec::new()
    }
    fn buffers_mut(&mut self) -> Vec<&mut Param> {
        Vec::new()
    }
    /// Full activation recomputation (`--recompute-granularity full`) is about to re-run
    /// (`true`) or has re-run (`false`) training forwards this module already ran once, with
    /// the same inputs and [`MlpStep`]: a recomputed forward must rebuild exactly what the first
    /// one saved for backward, and count nothing a second time (metrics, routing statistics).
    fn set_recomputing(&mut self, _recomputing: bool) -> Result<()> {
        Ok(())
    }
}

/// A factory: `Ok(None)` keeps the dense MLP in this layer (e.g. `--moe-layer-freq`).
pub type MlpFactory = fn(crate::registry::ConfigDe, &MlpEnv) -> Result<Option<Box<dyn MlpModule>>>;

/// A registered `mlp` plugin resolved with its config, ready to build one module per layer.
#[derive(Clone)]
pub struct MlpProvider {
    pub name: String,
    pub origin: Origin,
    pub config: serde_json::Value,
    pub(crate) factory: MlpFactory,
    pub(crate) guard: Option<PanicGuard>,
}

impl MlpProvider {
    /// The module for the slot `env` describes (`None`: dense MLP there).
    pub fn build(&self, env: &MlpEnv) -> Result<Option<Box<dyn MlpModule>>> {
        let (factory, config) = (self.factory, self.config.clone());
        match self.guard {
            None => with_config(config, |de| factory(de, env)),
            Some(guard) => {
                let label = format!("mlp `{}` from `{}`", self.name, self.origin);
                let built = guard
                    .call(|| with_config(config, |de| factory(de, env)))
                    .map_err(|m| anyhow!("plugin {label} panicked in its factory: {m}"))??;
                Ok(built.map(|m| Box::new(GuardedMlp { inner: m, guard, label }) as Box<dyn MlpModule>))
            }
        }
    }
}

/// A module from a plugin library, every call under the library's panic guard.
struct GuardedMlp {
    inner: Box<dyn MlpModule>,
    guard: PanicGuard,
    label: String,
}

impl GuardedMlp {
    fn call<R>(&mut self, method: &str, f: impl FnOnce(&mut dyn MlpModule) -> R) -> Result<R> {
        let (guard, inner) = (self.guard, &mut self.inner);
        guard.call(|| f(inner.as_mut())).map_err(|m| anyhow!("plugin {} panicked in {method}: {m}", self.label))
    }
}

impl MlpModule for GuardedMlp {
    fn forward(&mut self, x: &DeviceTensor, out: &mut DeviceTensor, step: MlpStep) -> Result<()> {
        self.call("forward", |m| m.forward(x, out, step))?
    }
    fn backward(&mut self, x: &DeviceTensor, d_out: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()> {
        self.call("backward", |m| m.backward(x, d_out, d_x))?
    }
    fn saved_activations_mut(&mut self) -> Vec<&mut DeviceTensor> {
        self.inner.saved_activations_mut()
    }
    fn params(&self) -> Vec<&Param> {
        self.inner.params()
    }
    fn params_mut(&mut self) -> Vec<&mut Param> {
        self.inner.params_mut()
    }
    fn finalize_grads(&mut self) -> Result<()> {
        self.call("finalize_grads", |m| m.finalize_grads())?
    }
    fn take_metrics(&mut self) -> Vec<(String, f64)> {
        self.call("take_metrics", |m| m.take_metrics()).unwrap_or_default()
    }
    fn buffers(&self) -> Vec<&Param> {
        self.inner.buffers()
    }
    fn buffers_mut(&mut self) -> Vec<&mut Param> {
        self.inner.buffers_mut()
    }
    fn set_recomputing(&mut self, recomputing: bool) -> Result<()> {
        self.call("set_recomputing", |m| m.set_recomputing(recomputing))?
    }
}
