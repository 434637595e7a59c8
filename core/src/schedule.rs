//! The pipeline [`Schedule`] trait: runs the microbatches of one global batch through this
//! rank's pipeline stage (SPEC §5.5).

use crate::{Batch, GradsReadyHook, LossReport, Model, ParallelContext, Result};

/// A schedule implements [`Schedule::run_with_grad_hook`] (then `run` is it without a hook)
/// or [`Schedule::run`] (then the hook reports every parameter at the end); each method's
/// default is written in terms of the other, so an implementation must override at least one.
pub trait Schedule: Send {
    /// Registered name (`no-pipelining`, `1f1b`, ...).
    fn name(&self) -> &str;
    /// Runs `num_microbatches` microbatches (forward, and backward unless `forward_only`),
    /// pulling each from `next_batch` (every stage pulls every microbatch: the first stage
    /// needs its tokens, the last its labels, all of them its dropout seed); the backward loss
    /// of each is its per-token mean divided by `num_microbatches` (SPEC §6.8). Returns the
    /// loss reports of this rank: one per microbatch on the last stage, none elsewhere.
    /// The default runs [`Schedule::run_with_grad_hook`] with a hook that does nothing.
    fn run(
        &mut self,
        model: &mut dyn Model,
        next_batch: &mut dyn FnMut() -> Result<Batch>,
        num_microbatches: usize,
        forward_only: bool,
        ctx: &ParallelContext,
    ) -> Result<Vec<LossReport>> {
        self.run_with_grad_hook(model, next_batch, num_microbatches, forward_only, ctx, &mut |_| Ok(()))
    }

    /// [`Schedule::run`], passing `on_grads_ready` to the model's
    /// [`Model::backward_stage`] for the LAST backward of the step only (the earlier ones run
    /// with gradient synchronization off, Megatron's `no_sync`), so a data-parallel reducer
    /// can overlap its reduction with that backward. The hook is never called when
    /// `forward_only`. The default (for schedules without the hook) runs [`Schedule::run`]
    /// and then reports every parameter ready at once.
    fn run_with_grad_hook(
        &mut self,
        model: &mut dyn Model,
        next_batch: &mut dyn FnMut() -> Result<Batch>,
        num_microbatches: usize,
        forward_only: bool,
        ctx: &ParallelContext,
        on_grads_ready: GradsReadyHook,
    ) -> Result<Vec<LossReport>> {
        let reports = self.run(model, next_batch, num_microbatches, forward_only, ctx)?;
        if !forward_only {
            on_grads_ready(&model.params())?;
        }
        Ok(reports)
    }
}
