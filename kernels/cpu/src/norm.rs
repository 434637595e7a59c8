//! LayerNorm and RMSNorm over the last dim, forward and backward side by side. Blocks of
//! [`ROWS`] rows run in parallel; the weight/bias gradients are summed per block and the block
//! sums added in block order ([`ordered_reduce`]), so the result does not depend on the thread
//! count or on scheduling.
//!
//! Cached by forward for backward: `mean` `(N)` and `rstd` `(N)` (RMSNorm: `rstd` only).

use crate::check::{f32s, f32s_mut, numel, rows_cols, same_numel};
use crate::elementwise::{add_into, ordered_reduce};
use crate::simd;
use crate::simd_kernel;
use megatron_core::{DeviceTensor, Result};
use rayon::prelude::*;

/// Rows per parallel task (C = 768: 96 KiB of input per task).
const ROWS: usize = 32;

pub(crate) fn layernorm_forward(
    x: &DeviceTensor,
    weight: &DeviceTensor,
    bias: Option<&DeviceTensor>,
    eps: f32,
    out: &mut DeviceTensor,
    mean: &mut DeviceTensor,
    rstd: &mut DeviceTensor,
) -> Result<()> {
    const OP: &str = "layernorm_forward";
    let (n, c) = rows_cols(OP, "x", x)?;
    numel(OP, "weight", weight, c, "the last dim of `x`")?;
    same_numel(OP, "x", x, "out", out)?;
    numel(OP, "mean", mean, n, "one value per row of `x`")?;
    numel(OP, "rstd", rstd, n, "one value per row of `x`")?;
    let (xv, w) = (f32s(OP, "x", x)?, f32s(OP, "weight", weight)?);
    let zero_bias;
    let b = match bias {
        Some(t) => {
            numel(OP, "bias", t, c, "the last dim of `x`")?;
            f32s(OP, "bias", t)?
        }
        None => {
            zero_bias = vec![0.0f32; c];
            &zero_bias
        }
    };
    let (o, mv, rv) = (f32s_mut(OP, "out", out)?, f32s_mut(OP, "mean", mean)?, f32s_mut(OP, "rstd", rstd)?);
    o.par_chunks_mut(ROWS * c)
        .zip(xv.par_chunks(ROWS * c))
        .zip(mv.par_chunks_mut(ROWS).zip(rv.par_chunks_mut(ROWS)))
        .for_each(|((o, x), (mv, rv))| layernorm_kernel(o, x, w, b, eps, mv, rv));
    Ok(())
}

simd_kernel! {
    fn layernorm_kernel(o: &mut [f32], x: &[f32], w: &[f32], b: &[f32], eps: f32, mv: &mut [f32], rv: &mut [f32]) {
        let c = w.len();
        for (((o, x), m), r) in o.chunks_exact_mut(c).zip(x.chunks_exact(c)).zip(mv).zip(rv) {
            // Two passes (mean, then centred variance) avoid E[x²]-E[x]² cancellation.
            let mu = simd::sum_map(x, |v| v) / c as f32;
            let var = simd::sum_map(x, |v| (v - mu) * (v - mu)) / c as f32;
            let rs = 1.0 / (var + eps).sqrt();
            o.iter_mut().zip(x).zip(w.iter().zip(b)).for_each(|((o, &x), (&w, &b))| *o = (x - mu) * rs * w + b);
            *m = mu;
            *r = rs;
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn layernorm_backward(
    d_out: &DeviceTensor,
    x: &DeviceTensor,
    weight: &DeviceTensor,
    mean: &DeviceTensor,
    rstd: &DeviceTensor,
    d_x: &mut DeviceTensor,
    d_weight: &mut DeviceTensor,
    d_bias: Option<&mut DeviceTensor>,
) -> Result<()> {
    const OP: &str = "layernorm_backward";
    let (n, c) = rows_cols(OP, "x", x)?;
    numel(OP, "weight", weight, c, "the last dim of `x`")?;
    same_numel(OP, "x", x, "d_out", d_out)?;
    same_numel(OP, "x", x, "d_x", d_x)?;
    numel(OP, "mean", mean, n, "one value per row of `x`")?;
    numel(OP, "rstd", rstd, n, "one value per row of `x`")?;
    numel(OP, "d_weight", d_weight, c, "the last dim of `x`")?;
    if let Some(db) = &d_bias {
        numel(OP, "d_bias", db, c, "the last dim of `x`")?;
    }
    let (dy, xv, w) = (f32s(OP, "d_out", d_out)?, f32s(OP, "x", x)?, f32s(OP, "weight", weight)?);
    let (mv, rv) = (f32s(OP, "mean", mean)?, f32s(OP, "rstd", rstd)?);
    let dx = f32s_mut(OP, "d_x", d_x)?;
    // [dW | dB] partial sums (2C), one per task, reduced below.
    let partial = ordered_reduce(
        dx.par_chunks_mut(ROWS * c)
            .zip(dy.par_chunks(ROWS * c).zip(xv.par_chunks(ROWS * c)))
            .zip(mv.par_chunks(ROWS).zip(rv.par_chunks(ROWS))),
        |((dx, (dy, x)), (mv, rv))| {
            let mut dwb = vec![0.0f32; 2 * c];
            layernorm_backward_kernel(dx, dy, x, w, mv, rv, &mut dwb);
            dwb
        },
        |mut a, b| {
            add_into(&mut a, &b);
            a
        },
    );
    let dwb = partial.unwrap_or_else(|| vec![0.0; 2 * c]);
    add_into(f32s_mut(OP, "d_weight", d_weight)?, &dwb[..c]);
    if let Some(d_bias) = d_bias {
        add_into(f32s_mut(OP, "d_bias", d_bias)?, &dwb[c..]);
    }
    Ok(())
}

simd_kernel! {
    /// `dwb = [dW (C) | dB (C)]` accumulated over the rows of this block.
    fn layernorm_backward_kernel(
        dx: &mut [f32],
        dy: &[f32],
        x: &[f32],
        w: &[f32],
        mv: &[f32],
        rv: &[f32],
        dwb: &mut [f32],
    ) {
        let c = w.len();
        let (dw, db) = dwb.split_at_mut(c);
        for ((dx, (dy, x)), (&mu, &rs)) in
            dx.chunks_exact_mut(c).zip(dy.chunks_exact(c).zip(x.chunks_exact(c))).zip(mv.iter().zip(rv))
        {
            let m1 = simd::sum_map2(dy, w, |dy, w| dy * w) / c as f32;
            let m2 = simd::sum_map3(dy, x, w, |dy, x, w| dy * w * (x - mu)) * rs / c as f32;
            for ((dx, (&dy, &x)), ((&w, dw), db)) in
                dx.iter_mut().zip(dy.iter().zip(x)).zip(w.iter().zip(dw.iter_mut()).zip(db.iter_mut()))
            {
                let xhat = (x - mu) * rs;
                *dx = rs * (dy * w - m1 - xhat * m2);
                *dw += dy * xhat;
                *db += dy;
            }
        }
    }
}

pub(crate) fn rmsnorm_forward(
    x: &DeviceTensor,
    weight: &DeviceTensor,
    eps: f32,
    out: &mut DeviceTensor,
    rstd: &mut DeviceTensor,
) -> Result<()> {
    const OP: &str = "rmsnorm_forward";
    let (n, c) = rows_cols(OP, "x", x)?;
    numel(OP, "weight", weight, c, "the last dim of `x`")?;
    same_numel(OP, "x", x, "out", out)?;
    numel(OP, "rstd", rstd, n, "one value per row of `x`")?;
    let (xv, w) = (f32s(OP, "x", x)?, f32s(OP, "weight", weight)?);
    let (o, rv) = (f32s_mut(OP, "out", out)?, f32s_mut(OP, "rstd", rstd)?);
    o.par_chunks_mut(ROWS * c)
        .zip(xv.par_chunks(ROWS * c))
        .zip(rv.par_chunks_mut(ROWS))
        .for_each(|((o, x), rv)| rmsnorm_kernel(o, x, w, eps, rv));
    Ok(())
}

simd_kernel! {
    fn rmsnorm_kernel(o: &mut [f32], x: &[f32], w: &[f32], eps: f32, rv: &mut [f32]) {
        let c = w.len();
        for ((o, x), r) in o.chunks_exact_mut(c).zip(x.chunks_exact(c)).zip(rv) {
            let rs = 1.0 / (simd::sum_map(x, |v| v * v) / c as f32 + eps).sqrt();
            o.iter_mut().zip(x).zip(w).for_each(|((o, &x), &w)| *o = x * rs * w);
            *r = rs;
        }
    }
}

pub(crate) fn rmsnorm_backward(
    d_out: &DeviceTensor,
    x: &DeviceTensor,
    weight: &DeviceTensor,
    rstd: &DeviceTensor,
    d_x: &mut DeviceTensor,
    d_weight: &mut DeviceTensor,
) -> Result<()> {
    const OP: &str = "rmsnorm_backward";
    let (n, c) = rows_cols(OP, "x", x)?;
    numel(OP, "weight", weight, c, "the last dim of `x`")?;
    same_numel(OP, "x", x, "d_out", d_out)?;
    same_numel(OP, "x", x, "d_x", d_x)?;
    numel(OP, "rstd", rstd, n, "one value per row of `x`")?;
    numel(OP, "d_weight", d_weight, c, "the last dim of `x`")?;
    let (dy, xv) = (f32s(OP, "d_out", d_out)?, f32s(OP, "x", x)?);
    let (w, rv) = (f32s(OP, "weight", weight)?, f32s(OP, "rstd", rstd)?);
    let dx = f32s_mut(OP, "d_x", d_x)?;
    let partial = ordered_reduce(
        dx.par_chunks_mut(ROWS * c).zip(dy.par_chunks(ROWS * c).zip(xv.par_chunks(ROWS * c))).zip(rv.par_chunks(ROWS)),
        |((dx, (dy, x)), rv)| {
            let mut dw = vec![0.0f32; c];
            rmsnorm_backward_kernel(dx, dy, x, w, rv, &mut dw);
            dw
        },
        |mut a, b| {
            add_into(&mut a, &b);
            a
        },
    );
    if let Some(dw) = partial {
        add_into(f32s_mut(OP, "d_weight", d_weight)?, &dw);
    }
    Ok(())
}

simd_kernel! {
    fn rmsnorm_backward_kernel(dx: &mut [f32], dy: &[f32], x: &[f32], w: &[f32], rv: &[f32], dw: &mut [f32]) {
        let c = w.len();
        for ((dx, (dy, x)), &rs) in dx.chunks_exact_mut(c).zip(dy.chunks_exact(c).zip(x.chunks_exact(c))).zip(rv) {
            // m = mean_j(dy_j w_j x̂_j)
            let m = simd::sum_map3(dy, x, w, |dy, x, w| dy * w * x) * rs / c as f32;
            for ((dx, (&dy, &x)), (&w, dw)) in dx.iter_mut().zip(dy.iter().zip(x)).zip(w.iter().zip(dw.iter_mut())) {
                let xhat = x * rs;
                *dx = rs * (dy * w - xhat * m);
                *dw += dy * xhat;
            }
        }
    }
}
