//! `impl EmbeddingLossOps for CpuBackend`: embedding lookup and the vocab-parallel cross-entropy pieces.

use crate::widen::{input, Out};
use crate::{embedding, loss, CpuBackend};
use megatron_core::{DeviceTensor, EmbeddingLossOps, Result};

impl EmbeddingLossOps for CpuBackend {
    fn embedding_forward(
        &self,
        ids: &DeviceTensor,
        table: &DeviceTensor,
        row_start: usize,
        out: &mut DeviceTensor,
        accumulate: bool,
    ) -> Result<()> {
        self.run(|| {
            let table = input(table)?;
            let mut o = Out::new(out, accumulate)?;
            embedding::embedding_forward(ids, &table, row_start, o.t(), accumulate)?;
            o.finish()
        })
    }
    fn embedding_backward(
        &self,
        ids: &DeviceTensor,
        d_out: &DeviceTensor,
        row_start: usize,
        d_table: &mut DeviceTensor,
    ) -> Result<()> {
        self.run(|| {
            let d_out = input(d_out)?;
            let mut o = Out::new(d_table, true)?;
            embedding::embedding_backward(ids, &d_out, row_start, o.t())?;
            o.finish()
        })
    }
    fn row_max(&self, logits: &DeviceTensor, row_max: &mut DeviceTensor) -> Result<()> {
        self.run(|| loss::row_max(logits, row_max))
    }
    fn cross_entropy_stats(
        &self,
        logits: &DeviceTensor,
        targets: &DeviceTensor,
        vocab_start: usize,
        row_max: &DeviceTensor,
        sum_exp: &mut DeviceTensor,
        target_logit: &mut DeviceTensor,
    ) -> Result<()> {
        self.run(|| loss::cross_entropy_stats(logits, targets, vocab_start, row_max, sum_exp, target_logit))
    }
    fn cross_entropy_backward_inplace(
        &self,
        logits: &mut DeviceTensor,
        targets: &DeviceTensor,
        vocab_start: usize,
        row_max: &DeviceTensor,
        sum_exp: &DeviceTensor,
        d_loss: &DeviceTensor,
    ) -> Result<()> {
        self.run(|| loss::cross_entropy_backward_inplace(logits, targets, vocab_start, row_max, sum_exp, d_loss))
    }
}
