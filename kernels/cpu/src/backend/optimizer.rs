//! `impl OptimizerOps for CpuBackend`: AdamW and SGD steps.

use crate::widen::{input, Out};
use crate::{optim, CpuBackend};
use megatron_core::{AdamStep, DeviceTensor, OptimizerOps, Result};

impl OptimizerOps for CpuBackend {
    fn adam_step(
        &self,
        param: &mut DeviceTensor,
        grad: &DeviceTensor,
        exp_avg: &mut DeviceTensor,
        exp_avg_sq: &mut DeviceTensor,
        step: AdamStep,
    ) -> Result<()> {
        self.run(|| {
            let grad = input(grad)?;
            let mut p = Out::new(param, true)?;
            let (mut m, mut v) = (Out::new(exp_avg, true)?, Out::new(exp_avg_sq, true)?);
            optim::adam_step(p.t(), &grad, m.t(), v.t(), step)?;
            p.finish()?;
            m.finish()?;
            v.finish()
        })
    }
    fn sgd_step(
        &self,
        param: &mut DeviceTensor,
        grad: &DeviceTensor,
        momentum_buf: &mut DeviceTensor,
        lr: f32,
        momentum: f32,
        weight_decay: f32,
        first_step: bool,
    ) -> Result<()> {
        self.run(|| {
            let grad = input(grad)?;
            let (mut p, mut b) = (Out::new(param, true)?, Out::new(momentum_buf, true)?);
            optim::sgd_step(p.t(), &grad, b.t(), lr, momentum, weight_decay, first_step)?;
            p.finish()?;
            b.finish()
        })
    }
}
