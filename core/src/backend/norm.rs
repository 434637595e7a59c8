//! [`NormOps`]: LayerNorm and RMSNorm, forward and backward, with fp32 statistics.

use crate::{DeviceTensor, Result};

/// LayerNorm and RMSNorm over the last dim.
pub trait NormOps {
    /// `out = (x - mean)/sqrt(var + eps) * w + b` over the last dim; saves `mean`, `rstd` `[N]`.
    #[allow(clippy::too_many_arguments)]
    fn layernorm_forward(
        &self,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        bias: Option<&DeviceTensor>,
        eps: f32,
        out: &mut DeviceTensor,
        mean: &mut DeviceTensor,
        rstd: &mut DeviceTensor,
    ) -> Result<()>;
    #[allow(clippy::too_many_arguments)]
    fn layernorm_backward(
        &self,
        d_out: &DeviceTensor,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        mean: &DeviceTensor,
        rstd: &DeviceTensor,
        d_x: &mut DeviceTensor,
        d_weight: &mut DeviceTensor,
        d_bias: Option<&mut DeviceTensor>,
    ) -> Result<()>;
    /// `out = x / sqrt(mean(x²) + eps) * w`; saves `rstd` `[N]`.
    fn rmsnorm_forward(
        &self,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        eps: f32,
        out: &mut DeviceTensor,
        rstd: &mut DeviceTensor,
    ) -> Result<()>;
    fn rmsnorm_backward(
        &self,
        d_out: &DeviceTensor,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        rstd: &DeviceTensor,
        d_x: &mut DeviceTensor,
        d_weight: &mut DeviceTensor,
    ) -> Result<()>;
}
