//! `impl ActivationOps for CpuBackend`: GeLU, SwiGLU, softmax and dropout.

use crate::widen::{input, Out};
use crate::{activation, elementwise, CpuBackend};
use megatron_core::{ActivationOps, DeviceTensor, Result};

impl ActivationOps for CpuBackend {
    fn gelu_forward(&self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        self.run(|| activation::gelu_forward(x, out))
    }
    fn gelu_backward(&self, x: &DeviceTensor, d_out: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()> {
        self.run(|| activation::gelu_backward(x, d_out, d_x))
    }
    fn swiglu_forward(&self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        self.run(|| {
            let x = input(x)?;
            let mut o = Out::new(out, false)?;
            activation::swiglu_forward(&x, o.t())?;
            o.finish()
        })
    }
    fn swiglu_backward(&self, x: &DeviceTensor, d_out: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()> {
        self.run(|| {
            let (x, d_out) = (input(x)?, input(d_out)?);
            let mut o = Out::new(d_x, false)?;
            activation::swiglu_backward(&x, &d_out, o.t())?;
            o.finish()
        })
    }
    fn softmax_forward(&self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        self.run(|| {
            let x = input(x)?;
            let mut o = Out::new(out, false)?;
            activation::softmax_forward(&x, o.t())?;
            o.finish()
        })
    }
    fn softmax_backward(&self, y: &DeviceTensor, d_y: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()> {
        self.run(|| {
            let (y, d_y) = (input(y)?, input(d_y)?);
            let mut o = Out::new(d_x, false)?;
            activation::softmax_backward(&y, &d_y, o.t())?;
            o.finish()
        })
    }
    fn dropout(&self, x: &mut DeviceTensor, p: f32, seed: u64) -> Result<()> {
        self.run(|| elementwise::dropout(x, p, seed))
    }
}
