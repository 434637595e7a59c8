//! The pipeline [`Schedule`] trait: runs the microbatches of one global batch.

use crate::{Batch, LossReport, Model, ParallelContext, Result};

pub trait Schedule: Send {
    /// Registered name (`no-pipelining`, `1f1b`, ...).
    fn name(&self) -> &str;
    /// Runs `num_microbatches` microbatches (forward, and backward unless `forward_only`),
    /// pulling each from `next_batch`; the backward loss of each is its per-token mean
    /// divided by `num_microbatches` (SPEC §6.8). Returns the loss reports of this rank.
    fn run(
        &mut self,
        model: &mut dyn Model,
        next_batch: &mut dyn FnMut() -> Result<Batch>,
        num_microbatches: usize,
        forward_only: bool,
        ctx: &ParallelContext,
    ) -> Result<Vec<LossReport>>;
}
