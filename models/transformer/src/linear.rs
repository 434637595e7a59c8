//! Tensor-parallel linear layers (SPEC §5.2): [`ColumnParallelLinear`] and
//! [`RowParallelLinear`], plus the plain gemm forward/backward they share with layers whose
//! weight lives elsewhere (the tied output layer).
//!
//! A weight is `[out, in]` (PyTorch `Linear`), `y = x W^T + b`. Column-parallel splits `out`
//! (and the bias); row-parallel splits `in`, keeps the bias whole and adds it after the
//! reduction. Layers do not keep their input: the caller owns it (it is usually another
//! module's cached output) and hands it back to `backward`.

use crate::init::{Init, ModuleBuilder, Split};
use crate::step::empty;
use crate::tp_mappings::{
    copy_to_tp_region_backward, copy_to_tp_region_forward, reduce_from_tp_region_backward,
    reduce_from_tp_region_forward,
};
use anyhow::{bail, Result};
use megatron_core::{Backend, DeviceTensor, GemmSpec, HostBuffer, ParallelContext, Param};
use std::sync::Arc;

/// Global sizes and init of a parallel linear layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinearConfig {
    pub in_features: usize,
    pub out_features: usize,
    pub bias: bool,
    /// Std of the weight's `Normal(0, std)` init.
    pub init_std: f32,
    /// Logical blocks along `out` sharded separately (2 for the gate/up halves of a gated MLP).
    pub out_chunks: usize,
}

/// A linear layer as the transformer modules see it, whatever the provider built.
pub trait LinearLayer: Send {
    /// `out (N, out_local) = x (N, in_local) W^T + b` including this layer's collectives.
    fn forward(&mut self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()>;
    /// Accumulates `d_W`, `d_b` and, when `d_x` is given, overwrites it with `d x (N, in_local)`.
    fn backward(&mut self, x: &DeviceTensor, d_out: &DeviceTensor, d_x: Option<&mut DeviceTensor>) -> Result<()>;
    /// `(in_local, out_local)`: the feature sizes of this rank's shard.
    fn local_features(&self) -> (usize, usize);
    /// What the last forward saved for backward besides the caller-owned input (see
    /// [`crate::step::SavedActivations`]). The local linears keep nothing per microbatch (the
    /// row-parallel bias `ones` depend on the shape only); an implementation that caches
    /// something per forward (a transposed or quantised input) must list it here.
    fn saved_activations_mut(&mut self) -> Vec<&mut DeviceTensor> {
        Vec::new()
    }
    fn params(&self) -> Vec<&Param>;
    fn params_mut(&mut self) -> Vec<&mut Param>;
}

/// `out (N, n) = x (N, k) · w (n, k)^T (+ bias)`.
pub fn linear_forward(
    backend: &dyn Backend,
    x: &DeviceTensor,
    w: &DeviceTensor,
    bias: Option<&DeviceTensor>,
    out: &mut DeviceTensor,
) -> Result<()> {
    let (n, k) = (w.shape()[0], w.shape()[1]);
    let rows = x.numel() / k.max(1);
    if x.numel() != rows * k || out.numel() != rows * n {
        bail!("linear forward: input {:?} / output {:?} do not match weight {:?}", x.shape(), out.shape(), w.shape());
    }
    backend.gemm(x, w, out, GemmSpec::linear(rows, n, k), bias)
}

/// Backward of [`linear_forward`]: `d_w (n, k) += d_out^T x`, `d_b (n) += Σ_rows d_out`,
/// `d_x (N, k) = d_out · w` (overwritten).
pub fn linear_backward(
    backend: &dyn Backend,
    x: &DeviceTensor,
    w: &DeviceTensor,
    d_out: &DeviceTensor,
    d_x: Option<&mut DeviceTensor>,
    d_w: &mut DeviceTensor,
    d_b: Option<&mut DeviceTensor>,
) -> Result<()> {
    let (n, k) = (w.shape()[0], w.shape()[1]);
    let rows = x.numel() / k.max(1);
    if let Some(d_x) = d_x {
        let spec = GemmSpec { m: rows, n: k, k: n, trans_a: false, trans_b: false, alpha: 1.0, beta: 0.0 };
        backend.gemm(d_out, w, d_x, spec, None)?;
    }
    let spec = GemmSpec { m: n, n: k, k: rows, trans_a: true, trans_b: false, alpha: 1.0, beta: 1.0 };
    backend.gemm(d_out, x, d_w, spec, None)?;
    if let Some(d_b) = d_b {
        backend.sum_rows(d_out, d_b)?;
    }
    Ok(())
}

/// `Y = X A^T + b` with `A [out, in]` split on `out` over TP: rank `r` owns output features
/// `[r*out/tp, (r+1)*out/tp)` (per block when `out_chunks > 1`); the output stays partitioned.
pub struct ColumnParallelLinear {
    backend: Arc<dyn Backend>,
    ctx: ParallelContext,
    pub weight: Param,
    pub bias: Option<Param>,
}

impl ColumnParallelLinear {
    /// Parameters `{prefix}.weight` and `{prefix}.bias`.
    pub fn new(b: &ModuleBuilder, prefix: &str, cfg: LinearConfig) -> Result<ColumnParallelLinear> {
        let split = Split::Rows { chunks: cfg.out_chunks.max(1) };
        let weight = b.param(
            &format!("{prefix}.weight"),
            &[cfg.out_features, cfg.in_features],
            split,
            Init::Normal(cfg.init_std),
        )?;
        let bias = if cfg.bias {
            Some(b.param(&format!("{prefix}.bias"), &[cfg.out_features], split, Init::Zeros)?)
        } else {
            None
        };
        Ok(ColumnParallelLinear { backend: b.backend.clone(), ctx: b.ctx.clone(), weight, bias })
    }
}

impl LinearLayer for ColumnParallelLinear {
    fn forward(&mut self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        copy_to_tp_region_forward(&self.ctx, x)?;
        linear_forward(self.backend.as_ref(), x, &self.weight.value, self.bias.as_ref().map(|b| &b.value), out)
    }

    fn backward(&mut self, x: &DeviceTensor, d_out: &DeviceTensor, d_x: Option<&mut DeviceTensor>) -> Result<()> {
        let backend = self.backend.as_ref();
        let d_b = self.bias.as_mut().map(|b| &mut b.grad);
        match d_x {
            Some(d_x) => {
                linear_backward(backend, x, &self.weight.value, d_out, Some(&mut *d_x), &mut self.weight.grad, d_b)?;
                copy_to_tp_region_backward(&self.ctx, d_x)
            }
            None => linear_backward(backend, x, &self.weight.value, d_out, None, &mut self.weight.grad, d_b),
        }
    }

    fn local_features(&self) -> (usize, usize) {
        (self.weight.value.shape()[1], self.weight.value.shape()[0])
    }

    fn params(&self) -> Vec<&Param> {
        std::iter::once(&self.weight).chain(self.bias.as_ref()).collect()
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        std::iter::once(&mut self.weight).chain(self.bias.as_mut()).collect()
    }
}

/// `Y = X A^T + b` with `A [out, in]` split on `in` over TP: the input is already partitioned
/// (`input_is_parallel`), partial outputs are all-reduced, then the whole bias is added.
pub struct RowParallelLinear {
    backend: Arc<dyn Backend>,
    ctx: ParallelContext,
    pub weight: Param,
    pub bias: Option<Param>,
    /// `(N, 1)` ones: adds the bias after the all-reduce as a rank-1 gemm (only used at tp > 1;
    /// at tp = 1 the reduction is the identity and the bias is fused into the gemm).
    ones: DeviceTensor,
}

impl RowParallelLinear {
    /// Parameters `{prefix}.weight` and `{prefix}.bias`.
    pub fn new(b: &ModuleBuilder, prefix: &str, cfg: LinearConfig) -> Result<RowParallelLinear> {
        let weight = b.param(
            &format!("{prefix}.weight"),
            &[cfg.out_features, cfg.in_features],
            Split::Cols,
            Init::Normal(cfg.init_std),
        )?;
        let bias = if cfg.bias {
            Some(b.param(&format!("{prefix}.bias"), &[cfg.out_features], Split::Replicated, Init::Zeros)?)
        } else {
            None
        };
        let ones = empty(b.backend.as_ref())?;
        Ok(RowParallelLinear { backend: b.backend.clone(), ctx: b.ctx.clone(), weight, bias, ones })
    }
}

impl LinearLayer for RowParallelLinear {
    fn forward(&mut self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        let backend = self.backend.as_ref();
        let bias = self.bias.as_ref().map(|b| &b.value);
        if self.ctx.tp_size() == 1 {
            linear_forward(backend, x, &self.weight.value, bias, out)?;
            return reduce_from_tp_region_forward(&self.ctx, out);
        }
        linear_forward(backend, x, &self.weight.value, None, out)?;
        reduce_from_tp_region_forward(&self.ctx, out)?;
        if let Some(bias) = bias {
            let (n, rows) = (bias.numel(), out.numel() / bias.numel().max(1));
            if self.ones.shape() != [rows, 1] {
                self.ones = backend.from_host(HostBuffer::F32(vec![1.0; rows]), &[rows, 1])?;
            }
            let spec = GemmSpec { m: rows, n, k: 1, trans_a: false, trans_b: false, alpha: 1.0, beta: 1.0 };
            backend.gemm(&self.ones, bias, out, spec, None)?;
        }
        Ok(())
    }

    fn backward(&mut self, x: &DeviceTensor, d_out: &DeviceTensor, d_x: Option<&mut DeviceTensor>) -> Result<()> {
        reduce_from_tp_region_backward(&self.ctx, d_out)?;
        // The bias gradient is the same on every TP rank (d_out is replicated).
        let d_b = self.bias.as_mut().map(|b| &mut b.grad);
        linear_backward(self.backend.as_ref(), x, &self.weight.value, d_out, d_x, &mut self.weight.grad, d_b)
    }

    fn local_features(&self) -> (usize, usize) {
        (self.weight.value.shape()[1], self.weight.value.shape()[0])
    }

    fn params(&self) -> Vec<&Param> {
        std::iter::once(&self.weight).chain(self.bias.as_ref()).collect()
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        std::iter::once(&mut self.weight).chain(self.bias.as_mut()).collect()
    }
}
