//! [`ActivationOps`]: GeLU, SwiGLU, row softmax and dropout.

use crate::{DeviceTensor, Result};

/// Activations, softmax and dropout.
pub trait ActivationOps {
    /// GeLU, tanh approximation (Megatron's fused bias-GeLU).
    fn gelu_forward(&self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()>;
    fn gelu_backward(&self, x: &DeviceTensor, d_out: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()>;
    /// `x [N, 2F]` → `out [N, F] = silu(x[:, :F]) * x[:, F:]`.
    fn swiglu_forward(&self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()>;
    fn swiglu_backward(&self, x: &DeviceTensor, d_out: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()>;
    /// Row softmax over the last dim.
    fn softmax_forward(&self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()>;
    fn softmax_backward(&self, y: &DeviceTensor, d_y: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()>;
    /// Inverted dropout in place: keep with probability `1-p`, scale kept by `1/(1-p)`. The mask
    /// is a pure function of `(seed, element index)`; backward calls this again on the gradient
    /// with the same seed.
    fn dropout(&self, x: &mut DeviceTensor, p: f32, seed: u64) -> Result<()>;
}
