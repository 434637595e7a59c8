//! [`OptimizerOps`]: the fused per-tensor optimizer updates (AdamW, [`AdamStep`]; SGD).

use crate::{DeviceTensor, Result};

/// One fused AdamW update (decoupled weight decay, bias correction), Megatron/PyTorch
/// semantics: `p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g²;
/// p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamStep {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// 1-based step count for bias correction.
    pub step: u64,
}

/// Optimizer steps.
pub trait OptimizerOps {
    fn adam_step(
        &self,
        param: &mut DeviceTensor,
        grad: &DeviceTensor,
        exp_avg: &mut DeviceTensor,
        exp_avg_sq: &mut DeviceTensor,
        step: AdamStep,
    ) -> Result<()>;
    /// SGD with momentum and (coupled, as torch.optim.SGD) weight decay:
    /// `g' = g + wd p; buf = momentum*buf + g'; p -= lr*buf` (`buf = g'` on the first step).
    #[allow(clippy::too_many_arguments)]
    fn sgd_step(
        &self,
        param: &mut DeviceTensor,
        grad: &DeviceTensor,
        momentum_buf: &mut DeviceTensor,
        lr: f32,
        momentum: f32,
        weight_decay: f32,
        first_step: bool,
    ) -> Result<()>;
}
