//! Normalization layers over the hidden dim: [`LayerNorm`] (weight + bias) and [`RmsNorm`]
//! (weight only), both replicated over tensor parallelism (SPEC §4.1).

use crate::init::{Init, ModuleBuilder, Split};
use crate::step::{empty, ensure_shape};
use anyhow::Result;
use megatron_core::{Backend, DeviceTensor, Param};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Which normalization a spec slot uses (`--normalization`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NormKind {
    LayerNorm,
    RMSNorm,
}

/// A normalization layer over the last dim. It caches its per-row statistics; the caller
/// owns the input and hands it back to `backward`.
pub trait NormLayer: Send {
    /// `out (N, C) = norm(x (N, C))`.
    fn forward(&mut self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()>;
    /// Overwrites `d_x (N, C)`, accumulates the weight (and bias) gradients.
    fn backward(&mut self, d_out: &DeviceTensor, x: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()>;
    /// The per-row statistics the last forward saved for backward (see
    /// [`crate::step::SavedActivations`]); every implementation must list all of them, or a
    /// pipeline stage with several microbatches in flight backpropagates the wrong ones.
    fn saved_activations_mut(&mut self) -> Vec<&mut DeviceTensor>;
    fn params(&self) -> Vec<&Param>;
    fn params_mut(&mut self) -> Vec<&mut Param>;
}

/// `out = (x - mean)/sqrt(var + eps) * w + b`.
pub struct LayerNorm {
    backend: Arc<dyn Backend>,
    eps: f32,
    pub weight: Param,
    pub bias: Param,
    mean: DeviceTensor, // (N)
    rstd: DeviceTensor, // (N)
}

impl LayerNorm {
    /// Parameters `{prefix}.weight` (ones) and `{prefix}.bias` (zeros), both `[hidden]`.
    pub fn new(b: &ModuleBuilder, prefix: &str, hidden: usize, eps: f32) -> Result<LayerNorm> {
        let weight = b.param(&format!("{prefix}.weight"), &[hidden], Split::Replicated, Init::Ones)?;
        let bias = b.param(&format!("{prefix}.bias"), &[hidden], Split::Replicated, Init::Zeros)?;
        let backend = b.backend.clone();
        let (mean, rstd) = (empty(backend.as_ref())?, empty(backend.as_ref())?);
        Ok(LayerNorm { backend, eps, weight, bias, mean, rstd })
    }
}

impl NormLayer for LayerNorm {
    fn forward(&mut self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        let rows = x.numel() / self.weight.value.numel();
        ensure_shape(self.backend.as_ref(), &mut self.mean, &[rows])?;
        ensure_shape(self.backend.as_ref(), &mut self.rstd, &[rows])?;
        let (w, b) = (&self.weight.value, Some(&self.bias.value));
        self.backend.layernorm_forward(x, w, b, self.eps, out, &mut self.mean, &mut self.rstd)
    }

    fn backward(&mut self, d_out: &DeviceTensor, x: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()> {
        self.backend.layernorm_backward(
            d_out,
            x,
            &self.weight.value,
            &self.mean,
            &self.rstd,
            d_x,
            &mut self.weight.grad,
            Some(&mut self.bias.grad),
        )
    }

    fn saved_activations_mut(&mut self) -> Vec<&mut DeviceTensor> {
        vec![&mut self.mean, &mut self.rstd]
    }

    fn params(&self) -> Vec<&Param> {
        vec![&self.weight, &self.bias]
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        vec![&mut self.weight, &mut self.bias]
    }
}

/// `out = x / sqrt(mean(x²) + eps) * w` (no bias).
pub struct RmsNorm {
    backend: Arc<dyn Backend>,
    eps: f32,
    pub weight: Param,
    rstd: DeviceTensor, // (N)
}

impl RmsNorm {
    /// Parameter `{prefix}.weight` (ones, `[hidden]`).
    pub fn new(b: &ModuleBuilder, prefix: &str, hidden: usize, eps: f32) -> Result<RmsNorm> {
        let weight = b.param(&format!("{prefix}.weight"), &[hidden], Split::Replicated, Init::Ones)?;
        let rstd = empty(b.backend.as_ref())?;
        Ok(RmsNorm { backend: b.backend.clone(), eps, weight, rstd })
    }
}

impl NormLayer for RmsNorm {
    fn forward(&mut self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        let rows = x.numel() / self.weight.value.numel();
        ensure_shape(self.backend.as_ref(), &mut self.rstd, &[rows])?;
        self.backend.rmsnorm_forward(x, &self.weight.value, self.eps, out, &mut self.rstd)
    }

    fn backward(&mut self, d_out: &DeviceTensor, x: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()> {
        self.backend.rmsnorm_backward(d_out, x, &self.weight.value, &self.rstd, d_x, &mut self.weight.grad)
    }

    fn saved_activations_mut(&mut self) -> Vec<&mut DeviceTensor> {
        vec![&mut self.rstd]
    }

    fn params(&self) -> Vec<&Param> {
        vec![&self.weight]
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        vec![&mut self.weight]
    }
}
