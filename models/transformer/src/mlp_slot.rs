//! What fills a layer's MLP slot: the dense [`Mlp`] or a module from an `mlp` plugin
//! ([`megatron_core::MlpModule`], e.g. the MoE layer of `megatron-moe`). The layer calls the
//! slot exactly as it called the dense MLP, so a model gains MoE without being edited.

use crate::init::ModuleBuilder;
use crate::linear::{LinearConfig, LinearLayer};
use crate::mlp::Mlp;
use crate::norm::{NormKind, NormLayer};
use crate::spec::{Activation, MlpSpec, SpecProvider, TransformerConfig};
use crate::step::{ModuleScratch, StepInfo};
use anyhow::Result;
use megatron_core::{DeviceTensor, MlpEnv, MlpModule, MlpProvider, MlpStep, Param};

pub enum MlpSlot {
    Dense(Mlp),
    Plugin(Box<dyn MlpModule>),
}

impl MlpSlot {
    /// The provider's module for layer `layer_number` when it gives one, else the dense MLP.
    pub fn new(
        b: &ModuleBuilder,
        provider: &dyn SpecProvider,
        prefix: &str,
        cfg: &TransformerConfig,
        spec: MlpSpec,
        layer_number: usize,
    ) -> Result<MlpSlot> {
        match provider.mlp_module(b, prefix, cfg, spec, layer_number)? {
            Some(m) => Ok(MlpSlot::Plugin(m)),
            None => Ok(MlpSlot::Dense(Mlp::new(b, provider, prefix, cfg, spec)?)),
        }
    }

    pub fn forward(&mut self, x: &DeviceTensor, out: &mut DeviceTensor, step: &StepInfo) -> Result<()> {
        match self {
            MlpSlot::Dense(m) => m.forward(x, out, step),
            MlpSlot::Plugin(m) => {
                m.forward(x, out, MlpStep { batch: step.batch, seq: step.seq, train: step.train, seed: step.seed })
            }
        }
    }

    pub fn backward(
        &mut self,
        x: &DeviceTensor,
        d_out: &DeviceTensor,
        d_x: &mut DeviceTensor,
        scratch: &mut ModuleScratch,
    ) -> Result<()> {
        match self {
            MlpSlot::Dense(m) => m.backward(x, d_out, d_x, scratch),
            MlpSlot::Plugin(m) => m.backward(x, d_out, d_x),
        }
    }

    pub fn saved_activations_mut(&mut self) -> Vec<&mut DeviceTensor> {
        match self {
            MlpSlot::Dense(m) => m.saved_activations_mut(),
            MlpSlot::Plugin(m) => m.saved_activations_mut(),
        }
    }

    pub fn params(&self) -> Vec<&Param> {
        match self {
            MlpSlot::Dense(m) => m.params(),
            MlpSlot::Plugin(m) => m.params(),
        }
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        match self {
            MlpSlot::Dense(m) => m.params_mut(),
            MlpSlot::Plugin(m) => m.params_mut(),
        }
    }

    /// A plugin module's checkpointed buffers (the dense MLP has none).
    pub fn buffers(&self) -> Vec<&Param> {
        match self {
            MlpSlot::Dense(_) => Vec::new(),
            MlpSlot::Plugin(m) => m.buffers(),
        }
    }

    pub fn buffers_mut(&mut self) -> Vec<&mut Param> {
        match self {
            MlpSlot::Dense(_) => Vec::new(),
            MlpSlot::Plugin(m) => m.buffers_mut(),
        }
    }

    /// Once per step after the gradient reduction (a plugin's bookkeeping, e.g. expert bias).
    pub fn finalize_grads(&mut self) -> Result<()> {
        match self {
            MlpSlot::Dense(_) => Ok(()),
            MlpSlot::Plugin(m) => m.finalize_grads(),
        }
    }

    /// The plugin's metrics since the last call (none for the dense MLP).
    pub fn take_metrics(&mut self) -> Vec<(String, f64)> {
        match self {
            MlpSlot::Dense(_) => Vec::new(),
            MlpSlot::Plugin(m) => m.take_metrics(),
        }
    }

    /// Marks the following training forwards as recomputations (see
    /// [`MlpModule::set_recomputing`]); the dense MLP's forward has no side effects to skip.
    pub fn set_recomputing(&mut self, recomputing: bool) -> Result<()> {
        match self {
            MlpSlot::Dense(_) => Ok(()),
            MlpSlot::Plugin(m) => m.set_recomputing(recomputing),
        }
    }

    /// The dense MLP, if that is what fills the slot.
    pub fn dense(&self) -> Option<&Mlp> {
        match self {
            MlpSlot::Dense(m) => Some(m),
            MlpSlot::Plugin(_) => None,
        }
    }
}

/// A [`SpecProvider`] that fills MLP slots from an `mlp` plugin (where it gives a module) and
/// delegates everything else to `inner`.
pub struct WithMlpProvider<'a> {
    pub inner: &'a dyn SpecProvider,
    pub mlp: &'a MlpProvider,
}

impl SpecProvider for WithMlpProvider<'_> {
    fn column_parallel_linear(
        &self,
        b: &ModuleBuilder,
        prefix: &str,
        cfg: LinearConfig,
    ) -> Result<Box<dyn LinearLayer>> {
        self.inner.column_parallel_linear(b, prefix, cfg)
    }
    fn row_parallel_linear(&self, b: &ModuleBuilder, prefix: &str, cfg: LinearConfig) -> Result<Box<dyn LinearLayer>> {
        self.inner.row_parallel_linear(b, prefix, cfg)
    }
    fn norm(
        &self,
        b: &ModuleBuilder,
        prefix: &str,
        kind: NormKind,
        hidden: usize,
        eps: f32,
    ) -> Result<Box<dyn NormLayer>> {
        self.inner.norm(b, prefix, kind, hidden, eps)
    }
    fn mlp_module(
        &self,
        b: &ModuleBuilder,
        prefix: &str,
        cfg: &TransformerConfig,
        spec: MlpSpec,
        layer_number: usize,
    ) -> Result<Option<Box<dyn MlpModule>>> {
        let env = MlpEnv {
            backend: b.backend.clone(),
            ctx: b.ctx.clone(),
            prefix: prefix.to_string(),
            layer_number,
            num_layers: cfg.num_layers,
            hidden_size: cfg.hidden_size,
            ffn_hidden_size: cfg.ffn_hidden_size,
            swiglu: spec.activation == Activation::SwiGlu,
            bias: spec.bias,
            init_method_std: cfg.init_method_std,
            output_init_std: cfg.output_init_std(),
            seed: b.seed,
            sequence_parallel: b.sequence_parallel && b.tp_size() > 1,
        };
        let module = self.mlp.build(&env)?;
        // Plugins compute in fp32: a half model wraps them in the widening boundary.
        Ok(match module {
            Some(m) if b.dtype() != megatron_core::DType::F32 => {
                Some(Box::new(crate::mlp_half::Fp32Boundary::new(b.backend.clone(), m)) as Box<dyn MlpModule>)
            }
            other => other,
        })
    }
}
