//! [`TransformerBlock`]: `L` transformer layers and the final norm (`decoder.*`). It owns the
//! residual stream buffers and the backward scratch, allocated once per `(B, T)` shape.

use crate::init::ModuleBuilder;
use crate::layer::TransformerLayer;
use crate::norm::NormLayer;
use crate::spec::{SpecProvider, TransformerBlockSpec, TransformerConfig};
use crate::step::{empty, ensure_shape, BackwardScratch, StepInfo};
use anyhow::{bail, Result};
use megatron_core::{Backend, DeviceTensor, Param};
use std::sync::Arc;

pub struct TransformerBlock {
    backend: Arc<dyn Backend>,
    hidden: usize,
    pub layers: Vec<TransformerLayer>,
    pub final_layernorm: Option<Box<dyn NormLayer>>,
    /// `residuals[0]` is the block input, `residuals[l + 1]` the output of layer `l`.
    residuals: Vec<DeviceTensor>, // L+1 x (B, T, C)
    output: DeviceTensor,     // (B, T, C): final norm output
    d_residual: DeviceTensor, // (B, T, C): gradient of the residual stream in backward
    scratch: BackwardScratch,
}

impl TransformerBlock {
    /// Builds `{prefix}.layers.{i}.*` and `{prefix}.final_layernorm.*`.
    pub fn new(
        b: &ModuleBuilder,
        provider: &dyn SpecProvider,
        prefix: &str,
        cfg: &TransformerConfig,
        spec: &TransformerBlockSpec,
    ) -> Result<TransformerBlock> {
        cfg.validate(b.tp_size())?;
        if spec.layers.len() != cfg.num_layers {
            bail!("block spec has {} layer specs but num_layers is {}", spec.layers.len(), cfg.num_layers);
        }
        let layers = spec
            .layers
            .iter()
            .enumerate()
            .map(|(i, ls)| TransformerLayer::new(b, provider, &format!("{prefix}.layers.{i}"), cfg, ls, i))
            .collect::<Result<Vec<_>>>()?;
        let final_layernorm = match spec.final_layernorm {
            Some(kind) => Some(provider.norm(
                b,
                &format!("{prefix}.final_layernorm"),
                kind,
                cfg.hidden_size,
                cfg.layernorm_epsilon,
            )?),
            None => None,
        };
        let backend = b.backend.clone();
        let bk = backend.as_ref();
        Ok(TransformerBlock {
            hidden: cfg.hidden_size,
            residuals: (0..=layers.len()).map(|_| empty(bk)).collect::<Result<_>>()?,
            output: empty(bk)?,
            d_residual: empty(bk)?,
            scratch: BackwardScratch::new(bk)?,
            layers,
            final_layernorm,
            backend,
        })
    }

    /// The `(B, T, C)` input buffer, sized for `step`: the embedding writes into it.
    pub fn input_mut(&mut self, step: &StepInfo) -> Result<&mut DeviceTensor> {
        let shape = [step.batch, step.seq, self.hidden];
        for t in self.residuals.iter_mut().chain([&mut self.output, &mut self.d_residual]) {
            ensure_shape(self.backend.as_ref(), t, &shape)?;
        }
        Ok(&mut self.residuals[0])
    }

    /// Runs every layer and the final norm on the input written through [`Self::input_mut`].
    pub fn forward(&mut self, step: &StepInfo) -> Result<()> {
        for (l, layer) in self.layers.iter_mut().enumerate() {
            let (done, rest) = self.residuals.split_at_mut(l + 1);
            layer.forward(&done[l], &mut rest[0], step)?;
        }
        let last = &self.residuals[self.layers.len()];
        match self.final_layernorm.as_mut() {
            Some(norm) => norm.forward(last, &mut self.output),
            None => self.backend.copy(last, &mut self.output),
        }
    }

    /// The `(B, T, C)` block output of the last forward.
    pub fn output(&self) -> &DeviceTensor {
        &self.output
    }

    /// Backpropagates `d_output (B, T, C)` through the block; returns `dL/d input (B, T, C)`.
    pub fn backward(&mut self, d_output: &DeviceTensor, step: &StepInfo) -> Result<&DeviceTensor> {
        let last = &self.residuals[self.layers.len()];
        match self.final_layernorm.as_mut() {
            Some(norm) => norm.backward(d_output, last, &mut self.d_residual)?,
            None => self.backend.copy(d_output, &mut self.d_residual)?,
        }
        for (l, layer) in self.layers.iter_mut().enumerate().rev() {
            layer.backward(&self.residuals[l], &mut self.d_residual, &mut self.scratch, step)?;
        }
        Ok(&self.d_residual)
    }

    pub fn params(&self) -> Vec<&Param> {
        let mut p: Vec<&Param> = self.layers.iter().flat_map(|l| l.params()).collect();
        if let Some(norm) = &self.final_layernorm {
            p.extend(norm.params());
        }
        p
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut p: Vec<&mut Param> = self.layers.iter_mut().flat_map(|l| l.params_mut()).collect();
        if let Some(norm) = self.final_layernorm.as_mut() {
            p.extend(norm.params_mut());
        }
        p
    }
}
