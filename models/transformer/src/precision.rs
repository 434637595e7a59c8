//! Mixed precision of the building blocks (SPEC §6.7): which dtype parameters, activations,
//! gradient buffers and the residual stream use. Every module takes its dtypes from the
//! [`crate::ModuleBuilder`] it was built with, so a model gets bf16/fp16 by building its
//! modules with another [`Precision`], never by changing its code.
//!
//! What always stays fp32, whatever the precision: the per-row statistics the backend keeps
//! (norm mean/rstd, attention log-sum-exp, the cross-entropy row max / sum of exponentials /
//! target logit), and every accumulation inside an op (the backend's dtype rules). So the
//! softmax of the attention is computed in fp32 from half inputs (Megatron's
//! `--attention-softmax-in-fp32` is what we always do) and the loss statistics are fp32.

use anyhow::{bail, Result};
use megatron_core::DType;

/// The dtypes of one model's tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Precision {
    /// Parameters and activations (`--bf16` / `--fp16`; fp32 otherwise).
    pub params: DType,
    /// [`megatron_core::Param::grad`], the "main grads" microbatches accumulate into and data
    /// parallelism reduces: fp32 (`--accumulate-allreduce-grads-in-fp32` semantics), bf16 with
    /// `--grad-reduce-in-bf16`.
    pub grads: DType,
    /// The residual stream (the layer inputs/outputs and their gradient): fp32 with
    /// `--fp32-residual-connection`, else `params`.
    pub residual: DType,
}

impl Default for Precision {
    fn default() -> Precision {
        Precision { params: DType::F32, grads: DType::F32, residual: DType::F32 }
    }
}

impl Precision {
    /// Half (or fp32) parameters with fp32 gradients; `fp32_residual` keeps the residual
    /// stream in fp32.
    pub fn new(params: DType, fp32_residual: bool) -> Result<Precision> {
        let p = Precision { params, grads: DType::F32, residual: if fp32_residual { DType::F32 } else { params } };
        p.validate()?;
        Ok(p)
    }

    /// Every dtype must be a float type.
    pub fn validate(&self) -> Result<()> {
        for (what, d) in [("parameter", self.params), ("gradient", self.grads), ("residual", self.residual)] {
            if !d.is_float() {
                bail!("{what} dtype {d} is not a float type (fp32, bf16 or fp16)");
            }
        }
        Ok(())
    }

    /// Whether parameters are in a half type (the optimizer then keeps fp32 main params).
    pub fn is_half(&self) -> bool {
        self.params != DType::F32
    }
}
