//! One training iteration (SPEC §6.2, §6.6, §6.8) and one evaluation pass (SPEC §6.11).

use super::data::{microbatch_seed, DataCursor};
use super::Trainer;
use anyhow::Result;
use megatron_core::{LossReport, Param, ReduceOp};

/// The outcome of one iteration.
pub struct StepResult {
    /// Per-token mean loss over the global batch (SPEC §6.8).
    pub loss: f64,
    pub grad_norm: f64,
    /// The update was skipped because the loss or a gradient was inf/NaN.
    pub skipped: bool,
    /// LR used by this update.
    pub lr: f64,
}

/// `Σ loss_sum / Σ num_tokens`, reduced over data-parallel ranks. Only the last pipeline
/// stage has reports; with pp > 1 the sums are also added over the pipeline group (the other
/// stages contribute zeros), so every rank knows the loss and skips a NaN step together.
pub fn global_mean(reports: &[LossReport], trainer: &Trainer) -> Result<f64> {
    let mut sums = [0.0f64; 2];
    for r in reports {
        sums[0] += r.loss_sum;
        sums[1] += r.num_tokens;
    }
    let ctx = &trainer.ctx;
    ctx.comm.all_reduce_f64(&ctx.dp_group, &mut sums, ReduceOp::Sum)?;
    if ctx.pp_size() > 1 {
        ctx.comm.all_reduce_f64(&ctx.pp_group, &mut sums, ReduceOp::Sum)?;
    }
    Ok(sums[0] / sums[1].max(1.0))
}

impl Trainer {
    /// The DP×CP group (gradient reduction, the distributed optimizer's shards).
    fn dp_cp_group(&self) -> megatron_core::Group {
        #[cfg(feature = "parallel")]
        return megatron_parallel::dp_cp_group(&self.ctx);
        #[cfg(not(feature = "parallel"))]
        return self.ctx.dp_group.clone();
    }

    /// Forward/backward over all microbatches, DP reduction, clipping and the update.
    pub fn train_step(&mut self) -> Result<StepResult> {
        let consumed = self.state.consumed_train_samples;
        let iteration = self.state.iteration;
        let seed = self.cfg.args.seed;
        let m = self.cfg.num_microbatches;
        self.param_gather_before_forward()?;
        self.model.zero_grad()?;
        let cursor = self.train.as_ref().ok_or_else(|| anyhow::anyhow!("no training split"))?;
        let mut next = 0usize;
        let mut next_batch = || {
            let b = cursor.microbatch(consumed, next, microbatch_seed(seed, iteration, next));
            next += 1;
            b
        };
        // The schedule reports gradients final in the last microbatch's backward; the DDP
        // reducer starts their buckets then (with --overlap-grad-reduce).
        let sync = &mut self.grad_sync;
        let mut on_grads_ready = |ps: &[&Param]| match sync.as_mut() {
            Some(s) => s.grads_ready(ps),
            None => Ok(()),
        };
        // fp16: the backward starts from the scaled loss (SPEC §6.7).
        let mut scaled;
        let model: &mut dyn megatron_core::Model = match &self.loss_scaler {
            Some(scaler) => {
                scaled = super::loss_scaling::ScaledLoss::new(self.model.as_mut(), scaler.scale() as f32);
                &mut scaled
            }
            None => self.model.as_mut(),
        };
        let mut probe; // --pipeline-probe-compute-ms (measurements only)
        let model: &mut dyn megatron_core::Model = match self.cfg.args.pipeline_probe_compute_ms {
            Some(ms) => {
                probe = super::compute_probe::ProbeCompute::new(model, ms);
                &mut probe
            }
            None => model,
        };
        let reports =
            self.schedule.run_with_grad_hook(model, &mut next_batch, m, false, &self.ctx, &mut on_grads_ready)?;
        // Tests only (--inject-nan-grad); then SPEC §5.10: data-parallel sync, then the
        // embedding-group reduction of tied copies.
        self.guard_inject(iteration + 1, None)?;
        {
            let mut params = self.model.params_mut();
            match self.grad_sync.as_mut() {
                Some(s) => s.finish(&mut params, self.backend.as_ref())?,
                None => self.strategy.reduce_gradients(&mut params, self.backend.as_ref(), &self.ctx)?,
            }
        }
        self.model.finalize_grads()?;
        let loss = global_mean(&reports, self)?;
        let dp_group = self.cfg.args.use_distributed_optimizer.then(|| self.dp_cp_group());
        if self.unscale_and_check(dp_group.as_ref())? {
            // Overflow: skip the update and the LR step; the scaler has backed off (SPEC §6.7).
            let lr = self.lr_schedule.lr();
            return Ok(StepResult { loss, grad_norm: 0.0, skipped: true, lr });
        }
        let grad_norm = {
            let mut params = self.model.params_mut();
            // The distributed optimizer leaves each DP rank its shard of the reduced grads
            // (zeros elsewhere): the norm also sums over the DP×CP group.
            let (max, bk) = (self.cfg.args.clip_grad, self.backend.as_ref());
            megatron_optim::clip_grad_norm_sharded(&mut params, max, bk, &self.ctx, dp_group.as_ref())?
        };
        let held = self.guard_after_backward(iteration + 1, consumed, loss, grad_norm)?;
        let lr = self.lr_schedule.lr();
        if !loss.is_finite() || !grad_norm.is_finite() || held {
            // Megatron skips the update on inf/NaN (SPEC §6.7): the LR schedule does not step.
            return Ok(StepResult { loss, grad_norm, skipped: true, lr });
        }
        let wd = self.lr_schedule.weight_decay();
        {
            let mut params = self.model.params_mut();
            self.optimizer.step(&mut params, lr, wd, self.backend.as_ref())?;
        }
        self.lr_schedule.step(self.cfg.global_batch_size as u64);
        Ok(StepResult { loss, grad_norm, skipped: false, lr })
    }

    /// `eval_iters` forward-only global batches of `cursor` from `consumed` on; returns the
    /// per-token mean loss and the samples used.
    pub fn evaluate(&mut self, cursor: &DataCursor, consumed: u64, eval_iters: u64) -> Result<(f64, u64)> {
        self.finish_param_gather()?;
        let m = self.cfg.num_microbatches;
        let gbs = self.cfg.global_batch_size as u64;
        let mut all = Vec::new();
        for it in 0..eval_iters {
            let start = consumed + it * gbs;
            let mut next = 0usize;
            let mut next_batch = || {
                let b = cursor.microbatch(start, next, 0);
                next += 1;
                b
            };
            all.extend(self.schedule.run(self.model.as_mut(), &mut next_batch, m, true, &self.ctx)?);
        }
        Ok((global_mean(&all, self)?, eval_iters * gbs))
    }
}
