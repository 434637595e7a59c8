//! The T5 feed-forward block: column-parallel `linear_fc1` (`2F` outputs when gated, laid out
//! per rank as `[gate_local; up_local]`), the activation (GeLU on the backend; ReLU and the
//! gated GeLU on the host, see `host.rs`), row-parallel `linear_fc2`.

use crate::config::T5Activation;
use crate::host::{as_dtype, geglu_backward, geglu_forward, relu_backward, relu_forward};
use anyhow::Result;
use megatron_core::{Backend, DType, DeviceTensor, Param};
use megatron_transformer::step::{empty, ensure_buffer};
use megatron_transformer::{ColumnParallelLinear, LinearConfig, LinearLayer, ModuleBuilder, RowParallelLinear};
use std::sync::Arc;

pub struct T5Mlp {
    backend: Arc<dyn Backend>,
    pub linear_fc1: ColumnParallelLinear,
    pub linear_fc2: RowParallelLinear,
    act: T5Activation,
    /// `F/tp`.
    ffn_local: usize,
    /// Activation dtype (the model's parameter dtype).
    dtype: DType,
    fc1_out: DeviceTensor, // (N, F/tp), (N, 2F/tp) gated
    act_out: DeviceTensor, // (N, F/tp)
}

impl T5Mlp {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        b: &ModuleBuilder,
        prefix: &str,
        hidden: usize,
        ffn: usize,
        act: T5Activation,
        bias: bool,
        init_std: f32,
        output_init_std: f32,
    ) -> Result<T5Mlp> {
        let gates = if act == T5Activation::GatedGelu { 2 } else { 1 };
        let fc1 = LinearConfig { in_features: hidden, out_features: gates * ffn, bias, init_std, out_chunks: gates };
        let fc2 =
            LinearConfig { in_features: ffn, out_features: hidden, bias, init_std: output_init_std, out_chunks: 1 };
        let backend = b.backend.clone();
        Ok(T5Mlp {
            linear_fc1: ColumnParallelLinear::new(b, &format!("{prefix}.linear_fc1"), fc1)?,
            linear_fc2: RowParallelLinear::new(b, &format!("{prefix}.linear_fc2"), fc2)?,
            act,
            ffn_local: ffn / b.tp_size(),
            dtype: b.precision.params,
            fc1_out: empty(backend.as_ref())?,
            act_out: empty(backend.as_ref())?,
            backend,
        })
    }

    /// `out (N, C) = fc2(act(fc1(x (N, C))))`.
    pub fn forward(&mut self, x: &DeviceTensor, rows: usize, out: &mut DeviceTensor) -> Result<()> {
        let be = self.backend.as_ref();
        let gates = if self.act == T5Activation::GatedGelu { 2 } else { 1 };
        ensure_buffer(be, &mut self.fc1_out, &[rows, gates * self.ffn_local], self.dtype)?;
        ensure_buffer(be, &mut self.act_out, &[rows, self.ffn_local], self.dtype)?;
        self.linear_fc1.forward(x, &mut self.fc1_out)?;
        match self.act {
            T5Activation::Gelu => be.gelu_forward(&self.fc1_out, &mut self.act_out)?,
            T5Activation::Relu => relu_forward(be, &self.fc1_out, &mut self.act_out)?,
            T5Activation::GatedGelu => geglu_forward(be, &self.fc1_out, &mut self.act_out)?,
        }
        // The host activations return fp32: round once to the activation dtype.
        self.act_out = as_dtype(be, std::mem::replace(&mut self.act_out, empty(be)?), self.dtype)?;
        self.linear_fc2.forward(&self.act_out, out)
    }

    /// Overwrites `d_x (N, C)`; accumulates parameter gradients.
    pub fn backward(&mut self, x: &DeviceTensor, d_out: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()> {
        let be = self.backend.as_ref();
        let mut d_act = be.zeros(self.act_out.shape(), self.dtype)?;
        let mut d_fc1 = be.zeros(self.fc1_out.shape(), self.dtype)?;
        self.linear_fc2.backward(&self.act_out, d_out, Some(&mut d_act))?;
        match self.act {
            T5Activation::Gelu => be.gelu_backward(&self.fc1_out, &d_act, &mut d_fc1)?,
            T5Activation::Relu => relu_backward(be, &self.fc1_out, &d_act, &mut d_fc1)?,
            T5Activation::GatedGelu => geglu_backward(be, &self.fc1_out, &d_act, &mut d_fc1)?,
        }
        let d_fc1 = as_dtype(be, d_fc1, self.dtype)?;
        self.linear_fc1.backward(x, &d_fc1, Some(d_x))
    }

    /// Frees what backward needs (full recomputation re-runs [`Self::forward`]).
    pub fn drop_saved(&mut self) -> Result<()> {
        let be = self.backend.as_ref();
        (self.fc1_out, self.act_out) = (empty(be)?, empty(be)?);
        Ok(())
    }

    pub fn params(&self) -> Vec<&Param> {
        self.linear_fc1.params().into_iter().chain(self.linear_fc2.params()).collect()
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        self.linear_fc1.params_mut().into_iter().chain(self.linear_fc2.params_mut()).collect()
    }
}
