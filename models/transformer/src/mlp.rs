//! The MLP (SPEC §4.3): column-parallel `linear_fc1` → activation → row-parallel
//! `linear_fc2`. GeLU is the tanh approximation (Megatron's fused bias-GeLU); with SwiGLU,
//! fc1 has `2F` outputs laid out per rank as `[gate_local; up_local]`.

use crate::init::ModuleBuilder;
use crate::linear::{LinearConfig, LinearLayer};
use crate::spec::{Activation, MlpSpec, SpecProvider, TransformerConfig};
use crate::step::{empty, ensure_buffer, ModuleScratch, StepInfo};
use anyhow::Result;
use megatron_core::{Backend, DType, DeviceTensor, Param};
use std::sync::Arc;

pub struct Mlp {
    backend: Arc<dyn Backend>,
    pub linear_fc1: Box<dyn LinearLayer>,
    pub linear_fc2: Box<dyn LinearLayer>,
    activation: Activation,
    /// `F/tp`: width of the activation output on this rank.
    ffn_local: usize,
    /// dtype of the activations (the builder's parameter dtype).
    act: DType,
    fc1_out: DeviceTensor, // (B, T, F/tp), (B, T, 2F/tp) when gated
    act_out: DeviceTensor, // (B, T, F/tp)
}

impl Mlp {
    /// Builds `{prefix}.linear_fc1` and `{prefix}.linear_fc2`.
    pub fn new(
        b: &ModuleBuilder,
        provider: &dyn SpecProvider,
        prefix: &str,
        cfg: &TransformerConfig,
        spec: MlpSpec,
    ) -> Result<Mlp> {
        let (h, f) = (cfg.hidden_size, cfg.ffn_hidden_size);
        let gates = if spec.activation == Activation::SwiGlu { 2 } else { 1 };
        let fc1 = LinearConfig {
            in_features: h,
            out_features: gates * f,
            bias: spec.bias,
            init_std: cfg.init_method_std,
            out_chunks: gates,
        };
        let fc2 = LinearConfig {
            in_features: f,
            out_features: h,
            bias: spec.bias,
            init_std: cfg.output_init_std(),
            out_chunks: 1,
        };
        let backend = b.backend.clone();
        Ok(Mlp {
            linear_fc1: provider.column_parallel_linear(b, &format!("{prefix}.linear_fc1"), fc1)?,
            linear_fc2: provider.row_parallel_linear(b, &format!("{prefix}.linear_fc2"), fc2)?,
            activation: spec.activation,
            ffn_local: f / b.tp_size(),
            act: b.dtype(),
            fc1_out: empty(backend.as_ref())?,
            act_out: empty(backend.as_ref())?,
            backend,
        })
    }

    fn fc1_width(&self) -> usize {
        match self.activation {
            Activation::GeluTanh => self.ffn_local,
            Activation::SwiGlu => 2 * self.ffn_local,
        }
    }

    /// `out (B, T, C) = fc2(act(fc1(x (B, T, C))))` (before the residual dropout-add).
    pub fn forward(&mut self, x: &DeviceTensor, out: &mut DeviceTensor, step: &StepInfo) -> Result<()> {
        let backend = self.backend.as_ref();
        let fc1_width = self.fc1_width();
        ensure_buffer(backend, &mut self.fc1_out, &[step.batch, step.seq, fc1_width], self.act)?;
        ensure_buffer(backend, &mut self.act_out, &[step.batch, step.seq, self.ffn_local], self.act)?;
        self.linear_fc1.forward(x, &mut self.fc1_out)?;
        match self.activation {
            Activation::GeluTanh => backend.gelu_forward(&self.fc1_out, &mut self.act_out)?,
            Activation::SwiGlu => backend.swiglu_forward(&self.fc1_out, &mut self.act_out)?,
        }
        self.linear_fc2.forward(&self.act_out, out)
    }

    /// Overwrites `d_x (B, T, C)` from `d_out (B, T, C)`; accumulates parameter gradients.
    pub fn backward(
        &mut self,
        x: &DeviceTensor,
        d_out: &DeviceTensor,
        d_x: &mut DeviceTensor,
        scratch: &mut ModuleScratch,
    ) -> Result<()> {
        let backend = self.backend.as_ref();
        ensure_buffer(backend, &mut scratch.d_act, self.act_out.shape(), self.act)?;
        ensure_buffer(backend, &mut scratch.d_fc1, self.fc1_out.shape(), self.act)?;
        self.linear_fc2.backward(&self.act_out, d_out, Some(&mut scratch.d_act))?;
        match self.activation {
            Activation::GeluTanh => backend.gelu_backward(&self.fc1_out, &scratch.d_act, &mut scratch.d_fc1)?,
            Activation::SwiGlu => backend.swiglu_backward(&self.fc1_out, &scratch.d_act, &mut scratch.d_fc1)?,
        }
        self.linear_fc1.backward(x, &scratch.d_fc1, Some(d_x))
    }

    /// `fc1_out (B, T, F/tp)` (`2F/tp` gated) and `act_out (B, T, F/tp)` of the last forward
    /// (and whatever the linears keep), see [`crate::step::SavedActivations`].
    pub fn saved_activations_mut(&mut self) -> Vec<&mut DeviceTensor> {
        let mut v = vec![&mut self.fc1_out, &mut self.act_out];
        v.extend(self.linear_fc1.saved_activations_mut());
        v.extend(self.linear_fc2.saved_activations_mut());
        v
    }

    pub fn params(&self) -> Vec<&Param> {
        self.linear_fc1.params().into_iter().chain(self.linear_fc2.params()).collect()
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        self.linear_fc1.params_mut().into_iter().chain(self.linear_fc2.params_mut()).collect()
    }
}
