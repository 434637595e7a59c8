//! The `no-pipelining` schedule (SPEC §5.5): each microbatch's forward then backward in turn,
//! gradients accumulating; with Megatron's default loss normalisation (SPEC §6.8) the
//! backward loss of a microbatch is `loss_sum / max(num_tokens, 1) / M`. Only the last
//! microbatch's backward reports gradients ready (Megatron runs the others under `no_sync`).

use anyhow::{bail, Result};
use megatron_core::{Batch, GradsReadyHook, LossReport, Mode, Model, ParallelContext, Param, Schedule, StageOutput};

#[derive(Clone, Copy, Debug, Default)]
pub struct NoPipelining;

impl Schedule for NoPipelining {
    fn name(&self) -> &str {
        "no-pipelining"
    }

    fn run_with_grad_hook(
        &mut self,
        model: &mut dyn Model,
        next_batch: &mut dyn FnMut() -> Result<Batch>,
        num_microbatches: usize,
        forward_only: bool,
        ctx: &ParallelContext,
        on_grads_ready: GradsReadyHook,
    ) -> Result<Vec<LossReport>> {
        if ctx.pp_size() > 1 {
            bail!(
                "the `no-pipelining` schedule runs a single pipeline stage, but --pipeline-model-parallel-size is {}; \
                 pipelined runs need the 1F1B schedule (`1f1b`)",
                ctx.pp_size()
            );
        }
        if num_microbatches == 0 {
            bail!("a global batch needs at least one microbatch (--global-batch-size / (--micro-batch-size x dp))");
        }
        let mode = if forward_only { Mode::Eval } else { Mode::Train };
        let mut no_hook = |_: &[&Param]| Ok(());
        let mut reports = Vec::with_capacity(num_microbatches);
        for mb in 0..num_microbatches {
            let batch = next_batch()?;
            let report = match model.forward_stage(mb, &batch, None, mode)? {
                StageOutput::Loss(report) => report,
                StageOutput::Hidden(_) => bail!("model `{}` is not a single pipeline stage", model.name()),
            };
            if !forward_only {
                // d(backward loss)/d(per-token loss): per-token mean, averaged over microbatches.
                let scale = 1.0 / report.num_tokens.max(1.0) / num_microbatches as f64;
                let hook: GradsReadyHook = if mb + 1 == num_microbatches { &mut *on_grads_ready } else { &mut no_hook };
                model.backward_stage(mb, None, scale as f32, hook)?;
            }
            reports.push(report);
        }
        Ok(reports)
    }
}
