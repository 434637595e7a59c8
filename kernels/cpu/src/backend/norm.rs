//! `impl NormOps for CpuBackend`: LayerNorm and RMSNorm.

use crate::widen::{input, input_opt, out_opt, Out};
use crate::{norm, CpuBackend};
use megatron_core::{DeviceTensor, NormOps, Result};

impl NormOps for CpuBackend {
    fn layernorm_forward(
        &self,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        bias: Option<&DeviceTensor>,
        eps: f32,
        out: &mut DeviceTensor,
        mean: &mut DeviceTensor,
        rstd: &mut DeviceTensor,
    ) -> Result<()> {
        self.run(|| {
            let (x, weight, bias) = (input(x)?, input(weight)?, input_opt(bias)?);
            let mut o = Out::new(out, false)?;
            norm::layernorm_forward(&x, &weight, bias.as_deref(), eps, o.t(), mean, rstd)?;
            o.finish()
        })
    }
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
    ) -> Result<()> {
        self.run(|| {
            let (d_out, x, weight) = (input(d_out)?, input(x)?, input(weight)?);
            let mut dx = Out::new(d_x, false)?;
            let mut dw = Out::new(d_weight, true)?;
            let mut db = out_opt(d_bias, true)?;
            norm::layernorm_backward(&d_out, &x, &weight, mean, rstd, dx.t(), dw.t(), db.as_mut().map(|d| d.t()))?;
            dx.finish()?;
            dw.finish()?;
            db.map_or(Ok(()), Out::finish)
        })
    }
    fn rmsnorm_forward(
        &self,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        eps: f32,
        out: &mut DeviceTensor,
        rstd: &mut DeviceTensor,
    ) -> Result<()> {
        self.run(|| {
            let (x, weight) = (input(x)?, input(weight)?);
            let mut o = Out::new(out, false)?;
            norm::rmsnorm_forward(&x, &weight, eps, o.t(), rstd)?;
            o.finish()
        })
    }
    fn rmsnorm_backward(
        &self,
        d_out: &DeviceTensor,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        rstd: &DeviceTensor,
        d_x: &mut DeviceTensor,
        d_weight: &mut DeviceTensor,
    ) -> Result<()> {
        self.run(|| {
            let (d_out, x, weight) = (input(d_out)?, input(x)?, input(weight)?);
            let mut dx = Out::new(d_x, false)?;
            let mut dw = Out::new(d_weight, true)?;
            norm::rmsnorm_backward(&d_out, &x, &weight, rstd, dx.t(), dw.t())?;
            dx.finish()?;
            dw.finish()
        })
    }
}
