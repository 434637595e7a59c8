//! [`EmbeddingLossOps`]: the vocab-parallel pieces of the embedding lookup and of the
//! cross-entropy loss (SPEC §5.2/§5.4); the trainer all-reduces the statistics between them.

use crate::{DeviceTensor, Result};

/// Embeddings and loss (vocab-parallel pieces, SPEC §5.2/§5.4).
pub trait EmbeddingLossOps {
    /// `out[i] (+)= table[ids[i] - row_start]`, zero for ids outside
    /// `[row_start, row_start + rows)` (vocab-parallel lookup). `ids` is int32 `[N]`.
    fn embedding_forward(
        &self,
        ids: &DeviceTensor,
        table: &DeviceTensor,
        row_start: usize,
        out: &mut DeviceTensor,
        accumulate: bool,
    ) -> Result<()>;
    /// `d_table[ids[i] - row_start] += d_out[i]` for ids in range.
    fn embedding_backward(
        &self,
        ids: &DeviceTensor,
        d_out: &DeviceTensor,
        row_start: usize,
        d_table: &mut DeviceTensor,
    ) -> Result<()>;
    /// `row_max[i] = max_j logits[i, j]` over this rank's vocab slice.
    fn row_max(&self, logits: &DeviceTensor, row_max: &mut DeviceTensor) -> Result<()>;
    /// With the (all-reduced) `row_max`: `sum_exp[i] = Σ_j exp(logits[i,j] - row_max[i])` and
    /// `target_logit[i] = logits[i, t_i - vocab_start] - row_max[i]` when this rank owns the
    /// target `t_i`, else 0. Both `[N]` f32.
    fn cross_entropy_stats(
        &self,
        logits: &DeviceTensor,
        targets: &DeviceTensor,
        vocab_start: usize,
        row_max: &DeviceTensor,
        sum_exp: &mut DeviceTensor,
        target_logit: &mut DeviceTensor,
    ) -> Result<()>;
    /// Turns `logits` into `d_logits` in place (saves a `[N, V]` buffer):
    /// `d = (softmax - onehot(target)) * d_loss[i]` with the global `row_max`/`sum_exp`.
    fn cross_entropy_backward_inplace(
        &self,
        logits: &mut DeviceTensor,
        targets: &DeviceTensor,
        vocab_start: usize,
        row_max: &DeviceTensor,
        sum_exp: &DeviceTensor,
        d_loss: &DeviceTensor,
    ) -> Result<()>;
}
