//! The vocab-parallel cross-entropy pieces (SPEC §5.4): `row_max`, `cross_entropy_stats` and
//! the in-place `cross_entropy_backward_inplace`. Rows of the `[N, V]` logits (V = 50304 for
//! GPT-2) run in parallel; each row is one vectorised pass of [`crate::expvec`] exponentials.

use crate::check::{f32s, f32s_mut, i32s, numel, rows_cols};
use crate::simd;
use crate::simd_kernel;
use megatron_core::{DeviceTensor, Result};
use rayon::prelude::*;

/// Column of the target in this rank's slice `[vocab_start, vocab_start + v)`, if owned.
#[inline]
pub(crate) fn owned_column(target: i32, vocab_start: usize, v: usize) -> Option<usize> {
    let t = usize::try_from(target).ok()?;
    (t >= vocab_start && t < vocab_start + v).then(|| t - vocab_start)
}

pub(crate) fn row_max(logits: &DeviceTensor, row_max: &mut DeviceTensor) -> Result<()> {
    let (n, v) = rows_cols("row_max", "logits", logits)?;
    numel("row_max", "row_max", row_max, n, "one value per row of `logits`")?;
    let l = f32s("row_max", "logits", logits)?;
    let out = f32s_mut("row_max", "row_max", row_max)?;
    out.par_iter_mut().zip(l.par_chunks(v)).for_each(|(m, row)| *m = max_kernel(row));
    Ok(())
}

pub(crate) fn cross_entropy_stats(
    logits: &DeviceTensor,
    targets: &DeviceTensor,
    vocab_start: usize,
    row_max: &DeviceTensor,
    sum_exp: &mut DeviceTensor,
    target_logit: &mut DeviceTensor,
) -> Result<()> {
    const OP: &str = "cross_entropy_stats";
    let (n, v) = rows_cols(OP, "logits", logits)?;
    numel(OP, "targets", targets, n, "one target per row of `logits`")?;
    numel(OP, "row_max", row_max, n, "one value per row of `logits`")?;
    numel(OP, "sum_exp", sum_exp, n, "one value per row of `logits`")?;
    numel(OP, "target_logit", target_logit, n, "one value per row of `logits`")?;
    let (l, t, m) = (f32s(OP, "logits", logits)?, i32s(OP, "targets", targets)?, f32s(OP, "row_max", row_max)?);
    let se = f32s_mut(OP, "sum_exp", sum_exp)?;
    let tl = f32s_mut(OP, "target_logit", target_logit)?;
    se.par_iter_mut().zip(tl.par_iter_mut()).zip(l.par_chunks(v).zip(t.par_iter().zip(m.par_iter()))).for_each(
        |((se, tl), (row, (&target, &mx)))| {
            *se = sum_exp_kernel(row, mx);
            *tl = owned_column(target, vocab_start, v).map_or(0.0, |j| row[j] - mx);
        },
    );
    Ok(())
}

pub(crate) fn cross_entropy_backward_inplace(
    logits: &mut DeviceTensor,
    targets: &DeviceTensor,
    vocab_start: usize,
    row_max: &DeviceTensor,
    sum_exp: &DeviceTensor,
    d_loss: &DeviceTensor,
) -> Result<()> {
    const OP: &str = "cross_entropy_backward_inplace";
    let (n, v) = rows_cols(OP, "logits", logits)?;
    numel(OP, "targets", targets, n, "one target per row of `logits`")?;
    numel(OP, "row_max", row_max, n, "one value per row of `logits`")?;
    numel(OP, "sum_exp", sum_exp, n, "one value per row of `logits`")?;
    numel(OP, "d_loss", d_loss, n, "one value per row of `logits`")?;
    let (t, m, se, dl) = (
        i32s(OP, "targets", targets)?,
        f32s(OP, "row_max", row_max)?,
        f32s(OP, "sum_exp", sum_exp)?,
        f32s(OP, "d_loss", d_loss)?,
    );
    let l = f32s_mut(OP, "logits", logits)?;
    l.par_chunks_mut(v).zip(t.par_iter().zip(m.par_iter().zip(se.par_iter().zip(dl.par_iter())))).for_each(
        |(row, (&target, (&mx, (&s, &g))))| {
            let scale = g / s;
            softmax_scaled_kernel(row, mx, scale);
            if let Some(j) = owned_column(target, vocab_start, v) {
                row[j] -= g;
            }
        },
    );
    Ok(())
}

simd_kernel! {
    fn max_kernel(row: &[f32]) -> f32 {
        simd::max(row)
    }
}

simd_kernel! {
    fn sum_exp_kernel(row: &[f32], mx: f32) -> f32 {
        crate::expvec::sum_exp(row, mx)
    }
}

simd_kernel! {
    /// `row = exp(row - mx) * scale`.
    fn softmax_scaled_kernel(row: &mut [f32], mx: f32, scale: f32) {
        crate::expvec::exp_scale(row, mx, scale);
    }
}
