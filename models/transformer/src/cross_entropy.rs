//! Vocab-parallel cross entropy (SPEC §5.4) on logits `(N, V/tp)` in fp32: the row max is
//! all-reduced with MAX, the sum of exponentials and the target logit with SUM, and the
//! backward turns the logits buffer into its gradient in place (no second `(N, V)` buffer).

use crate::step::{empty, ensure_shape};
use crate::tp_mappings::all_reduce_tp;
use anyhow::Result;
use megatron_core::{Backend, DeviceTensor, ParallelContext, ReduceOp};
use std::sync::Arc;

pub struct VocabParallelCrossEntropy {
    backend: Arc<dyn Backend>,
    ctx: ParallelContext,
    row_max: DeviceTensor,      // (N): global max logit of every row
    sum_exp: DeviceTensor,      // (N): global Σ exp(logit - max)
    target_logit: DeviceTensor, // (N): target logit - max (summed over the owning rank)
}

impl VocabParallelCrossEntropy {
    pub fn new(backend: Arc<dyn Backend>, ctx: ParallelContext) -> Result<Self> {
        let bk = backend.as_ref();
        Ok(VocabParallelCrossEntropy {
            row_max: empty(bk)?,
            sum_exp: empty(bk)?,
            target_logit: empty(bk)?,
            backend,
            ctx,
        })
    }

    /// Per-token loss `log Σ exp(z) - z[target]` of `logits (N, V/tp)` whose first column is
    /// vocab id `vocab_start`; `targets` int32 `(N)`. Keeps the statistics for backward.
    pub fn forward(&mut self, logits: &DeviceTensor, targets: &DeviceTensor, vocab_start: usize) -> Result<Vec<f64>> {
        let rows = targets.numel();
        let bk = self.backend.as_ref();
        for t in [&mut self.row_max, &mut self.sum_exp, &mut self.target_logit] {
            ensure_shape(bk, t, &[rows])?;
        }
        bk.row_max(logits, &mut self.row_max)?;
        all_reduce_tp(&self.ctx, &mut self.row_max, ReduceOp::Max, "the cross-entropy row max")?;
        bk.cross_entropy_stats(logits, targets, vocab_start, &self.row_max, &mut self.sum_exp, &mut self.target_logit)?;
        all_reduce_tp(&self.ctx, &mut self.sum_exp, ReduceOp::Sum, "the cross-entropy sum of exponentials")?;
        all_reduce_tp(&self.ctx, &mut self.target_logit, ReduceOp::Sum, "the cross-entropy target logits")?;
        let sum_exp = bk.to_host(&self.sum_exp)?.to_f32_vec();
        let target = bk.to_host(&self.target_logit)?.to_f32_vec();
        Ok(sum_exp.iter().zip(&target).map(|(&s, &z)| (s as f64).ln() - z as f64).collect())
    }

    /// The row statistics `3·(N)` of the last forward (see [`crate::step::SavedActivations`]).
    pub fn saved_activations_mut(&mut self) -> Vec<&mut DeviceTensor> {
        vec![&mut self.row_max, &mut self.sum_exp, &mut self.target_logit]
    }

    /// Overwrites `logits` with `d loss / d logits = (softmax - onehot) * d_loss[i]`, using the
    /// statistics of the last [`Self::forward`] on the same logits and targets.
    pub fn backward_inplace(
        &mut self,
        logits: &mut DeviceTensor,
        targets: &DeviceTensor,
        vocab_start: usize,
        d_loss: &DeviceTensor,
    ) -> Result<()> {
        self.backend.cross_entropy_backward_inplace(logits, targets, vocab_start, &self.row_max, &self.sum_exp, d_loss)
    }
}
