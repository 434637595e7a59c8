//! [`Fp32Boundary`]: an `mlp` plugin module (MoE) inside a half-precision model. Plugin modules
//! compute in fp32 on the host (their parameters are fp32 and stay so: the mixed-precision
//! optimizer steps fp32 parameters as they are), so the slot widens the half activations it
//! hands them (exact) and rounds their outputs once into the model's dtype. The gradient
//! coming back in is widened the same way. Nothing else is kept: the input is widened again
//! in backward instead of keeping an fp32 copy for it.

use crate::step::ensure_buffer;
use anyhow::Result;
use megatron_core::{Backend, DType, DeviceTensor, MlpModule, MlpStep, Param};
use std::sync::Arc;

pub struct Fp32Boundary {
    backend: Arc<dyn Backend>,
    inner: Box<dyn MlpModule>,
}

impl Fp32Boundary {
    pub fn new(backend: Arc<dyn Backend>, inner: Box<dyn MlpModule>) -> Fp32Boundary {
        Fp32Boundary { backend, inner }
    }

    /// An fp32 copy of `t` (`t` widened: exact for bf16/fp16).
    fn widened(&self, t: &DeviceTensor) -> Result<DeviceTensor> {
        let mut out = self.backend.zeros(t.shape(), DType::F32)?;
        if t.dtype() == DType::F32 {
            self.backend.copy(t, &mut out)?;
        } else {
            self.backend.cast(t, &mut out)?;
        }
        Ok(out)
    }

    /// `dst` (its dtype, `src`'s shape) = `src` rounded once.
    fn narrow_into(&self, src: &DeviceTensor, dst: &mut DeviceTensor) -> Result<()> {
        let dtype = dst.dtype();
        ensure_buffer(self.backend.as_ref(), dst, src.shape(), dtype)?;
        if dtype == DType::F32 {
            self.backend.copy(src, dst)
        } else {
            self.backend.cast(src, dst)
        }
    }
}

impl MlpModule for Fp32Boundary {
    fn forward(&mut self, x: &DeviceTensor, out: &mut DeviceTensor, step: MlpStep) -> Result<()> {
        let x32 = self.widened(x)?;
        let mut o = self.backend.zeros(x.shape(), DType::F32)?;
        self.inner.forward(&x32, &mut o, step)?;
        self.narrow_into(&o, out)
    }

    fn backward(&mut self, x: &DeviceTensor, d_out: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()> {
        let (x32, d32) = (self.widened(x)?, self.widened(d_out)?);
        let mut dx = self.backend.zeros(x.shape(), DType::F32)?;
        self.inner.backward(&x32, &d32, &mut dx)?;
        self.narrow_into(&dx, d_x)
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
        self.inner.finalize_grads()
    }
    fn take_metrics(&mut self) -> Vec<(String, f64)> {
        self.inner.take_metrics()
    }
    fn buffers(&self) -> Vec<&Param> {
        self.inner.buffers()
    }
    fn buffers_mut(&mut self) -> Vec<&mut Param> {
        self.inner.buffers_mut()
    }
    fn set_recomputing(&mut self, recomputing: bool) -> Result<()> {
        self.inner.set_recomputing(recomputing)
    }
}
