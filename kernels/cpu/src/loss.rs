//! The vocab-parallel cross-entropy pieces (SPEC §5.4): `row_max`, `cross_entropy_stats` and
//! the in-place `cross_entropy_backward_inplace`. Rows of the `[N, V]` logits (V = 50304 for
//! GPT-2) run in parallel; each row is one vectorised pass of [`crate::expvec`] exponentials.
//!
//! bf16/fp16 logits are widened one row at a time into a per-thread f32 buffer (and the
//! in-place backward rounds each row back), so half logits never get a full-size f32 copy: at
//! GPT-2 shapes that copy would be the largest buffer of the step (`[4096, 50304]`, 824 MB).

use crate::check::{f32s, f32s_mut, floats, floats_mut, i32s, numel, rows_cols};
use crate::gemm_half::{Dst, Src};
use crate::simd;
use crate::simd_kernel;
use crate::widen::{narrow_bf16, narrow_f16, widen_bf16, widen_f16};
use megatron_core::{DeviceTensor, Result};
use rayon::prelude::*;

/// Column of the target in this rank's slice `[vocab_start, vocab_start + v)`, if owned.
#[inline]
pub(crate) fn owned_column(target: i32, vocab_start: usize, v: usize) -> Option<usize> {
    let t = usize::try_from(target).ok()?;
    (t >= vocab_start && t < vocab_start + v).then(|| t - vocab_start)
}

/// Row `i` (`v` wide) of `src` as f32: borrowed when fp32, else widened into `buf`.
fn row_f32<'b>(src: &'b Src, i: usize, v: usize, buf: &'b mut Vec<f32>) -> &'b [f32] {
    let r = i * v..(i + 1) * v;
    match src {
        Src::F32(x) => &x[r],
        Src::BF16(x) => {
            buf.resize(v, 0.0);
            widen_bf16(&x[r], buf);
            buf
        }
        Src::F16(x) => {
            buf.resize(v, 0.0);
            widen_f16(&x[r], buf);
            buf
        }
    }
}

pub(crate) fn row_max(logits: &DeviceTensor, row_max: &mut DeviceTensor) -> Result<()> {
    let (n, v) = rows_cols("row_max", "logits", logits)?;
    numel("row_max", "row_max", row_max, n, "one value per row of `logits`")?;
    let l = floats("row_max", "logits", logits)?;
    let out = f32s_mut("row_max", "row_max", row_max)?;
    out.par_iter_mut().enumerate().for_each_init(Vec::new, |buf, (i, m)| *m = max_kernel(row_f32(&l, i, v, buf)));
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
    let (l, t, m) = (floats(OP, "logits", logits)?, i32s(OP, "targets", targets)?, f32s(OP, "row_max", row_max)?);
    let se = f32s_mut(OP, "sum_exp", sum_exp)?;
    let tl = f32s_mut(OP, "target_logit", target_logit)?;
    se.par_iter_mut().zip(tl.par_iter_mut()).zip(t.par_iter().zip(m.par_iter())).enumerate().for_each_init(
        Vec::new,
        |buf, (i, ((se, tl), (&target, &mx)))| {
            let row = row_f32(&l, i, v, buf);
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
    let per_row = t.par_iter().zip(m.par_iter().zip(se.par_iter().zip(dl.par_iter())));
    // d = (softmax - onehot) * d_loss on one f32 row.
    let grad_row = |row: &mut [f32], (&target, (&mx, (&s, &g))): (&i32, (&f32, (&f32, &f32)))| {
        softmax_scaled_kernel(row, mx, g / s);
        if let Some(j) = owned_column(target, vocab_start, v) {
            row[j] -= g;
        }
    };
    match floats_mut(OP, "logits", logits)? {
        Dst::F32(l) => l.par_chunks_mut(v).zip(per_row).for_each(|(row, r)| grad_row(row, r)),
        Dst::BF16(l) => l.par_chunks_mut(v).zip(per_row).for_each_init(Vec::new, |buf, (row, r)| {
            buf.resize(v, 0.0);
            widen_bf16(row, buf);
            grad_row(buf, r);
            narrow_bf16(buf, row);
        }),
        Dst::F16(l) => l.par_chunks_mut(v).zip(per_row).for_each_init(Vec::new, |buf, (row, r)| {
            buf.resize(v, 0.0);
            widen_f16(row, buf);
            grad_row(buf, r);
            narrow_f16(buf, row);
        }),
    }
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
