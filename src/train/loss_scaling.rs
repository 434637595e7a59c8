//! fp16 loss scaling in the training step (SPEC §6.7): [`ScaledLoss`] multiplies the loss the
//! backward starts from by the live scale (the pipeline schedules stay unaware of it), and
//! [`Trainer::unscale_and_check`] divides the reduced gradients by it, looks for inf/NaN on
//! every rank that holds a part of them, and advances the scaler. An overflow skips the update:
//! no optimizer step, no LR step, counted in the log line's skipped iterations.

use super::Trainer;
use anyhow::Result;
use megatron_core::{DeviceTensor, GradsReadyHook, Model, ModelWrapper, Param, ReduceOp};

/// A model whose backward starts from `scale · loss`.
pub struct ScaledLoss<'a> {
    inner: &'a mut dyn Model,
    scale: f32,
}

impl<'a> ScaledLoss<'a> {
    pub fn new(inner: &'a mut dyn Model, scale: f32) -> ScaledLoss<'a> {
        ScaledLoss { inner, scale }
    }
}

/// Changes only where the backward starts; every other method forwards ([`ModelWrapper`]).
impl ModelWrapper for ScaledLoss<'_> {
    fn wrapped(&self) -> &dyn Model {
        &*self.inner
    }
    fn wrapped_mut(&mut self) -> &mut dyn Model {
        &mut *self.inner
    }
    fn backward(&mut self, grad_scale: f32) -> Result<()> {
        self.inner.backward(grad_scale * self.scale)
    }
    /// Only the last stage uses `grad_scale` (the others start from the received gradient,
    /// which already carries the scale).
    fn backward_stage(
        &mut self,
        microbatch: usize,
        grad_output: Option<DeviceTensor>,
        grad_scale: f32,
        on_grads_ready: GradsReadyHook,
    ) -> Result<Option<DeviceTensor>> {
        self.inner.backward_stage(microbatch, grad_output, grad_scale * self.scale, on_grads_ready)
    }
    /// As [`Model::backward_stage`]: only the last virtual stage uses `grad_scale`.
    fn backward_chunk(
        &mut self,
        chunk: usize,
        microbatch: usize,
        grad_output: Option<DeviceTensor>,
        grad_scale: f32,
        on_grads_ready: GradsReadyHook,
    ) -> Result<Option<DeviceTensor>> {
        self.inner.backward_chunk(chunk, microbatch, grad_output, grad_scale * self.scale, on_grads_ready)
    }
}

impl Trainer {
    /// After the gradients are reduced: multiplies them by `1/scale`, checks them for inf/NaN
    /// (all-reduced MAX over the model-parallel group, and over data parallel when the
    /// distributed optimizer left each rank a shard) and updates the scaler. Returns `true`
    /// when the step must be skipped. Without a scaler: `false`, nothing done.
    pub(super) fn unscale_and_check(&mut self, dp_group: Option<&megatron_core::Group>) -> Result<bool> {
        let Some(scaler) = self.loss_scaler.as_mut() else { return Ok(false) };
        let inv = scaler.inv_scale() as f32;
        let bk = self.backend.as_ref();
        let mut params = self.model.params_mut();
        for p in params.iter_mut() {
            bk.scale(&mut p.grad, inv)?;
        }
        let view: Vec<&Param> = params.iter().map(|p| &**p).collect();
        let mut found = megatron_optim::grads_have_inf_or_nan(&view, bk, &self.ctx)?;
        if let Some(g) = dp_group.filter(|g| g.size() > 1) {
            let mut f = [f64::from(u8::from(found))];
            self.ctx.comm.all_reduce_f64(g, &mut f, ReduceOp::Max)?;
            found = f[0] > 0.0;
        }
        Ok(scaler.update(found))
    }

    /// The live loss scale (1.0 without a scaler, as Megatron logs for fp32/bf16).
    pub fn loss_scale(&self) -> f64 {
        self.loss_scaler.as_ref().map_or(1.0, |s| s.scale())
    }
}

#[cfg(test)]
mod tests {
    use super::ScaledLoss;
    use megatron_core::recording_model::assert_forwards_every_method;

    #[test]
    fn scaled_loss_forwards_every_method() {
        assert_forwards_every_method("ScaledLoss", |mut inner, run| run(&mut ScaledLoss::new(&mut inner, 4.0)));
    }
}
