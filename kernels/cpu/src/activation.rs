//! Activations, forward and backward side by side: GeLU (tanh approximation), SwiGLU and the
//! row softmax. Parallel over chunks/rows; transcendental functions come from [`crate::simd`]
//! so the loops vectorise.

use crate::check::{f32s, f32s_mut, floats, floats_mut, rows_cols, same_numel};
use crate::elementwise::CHUNK;
use crate::simd;
use crate::simd_kernel;
use crate::widen::chunked;
use megatron_core::anyhow::bail;
use megatron_core::{DeviceTensor, Result};
use rayon::prelude::*;

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_C: f32 = 0.044_715;

pub(crate) fn gelu_forward(x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
    same_numel("gelu_forward", "x", x, "out", out)?;
    let xv = floats("gelu_forward", "x", x)?;
    chunked(floats_mut("gelu_forward", "out", out)?, false, &[xv], CHUNK, |_, o, x| gelu_kernel(o, x[0]));
    Ok(())
}

pub(crate) fn gelu_backward(x: &DeviceTensor, d_out: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()> {
    same_numel("gelu_backward", "x", x, "d_out", d_out)?;
    same_numel("gelu_backward", "x", x, "d_x", d_x)?;
    let (xv, dy) = (floats("gelu_backward", "x", x)?, floats("gelu_backward", "d_out", d_out)?);
    let dx = floats_mut("gelu_backward", "d_x", d_x)?;
    chunked(dx, false, &[xv, dy], CHUNK, |_, dx, i| gelu_backward_kernel(dx, i[0], i[1]));
    Ok(())
}

/// `(N, F)` of a SwiGLU input `[N, 2F]`.
fn swiglu_dims(op: &str, x: &DeviceTensor, out_name: &str, out: &DeviceTensor) -> Result<(usize, usize)> {
    let (n, c2) = rows_cols(op, "x", x)?;
    if c2 % 2 != 0 {
        bail!("cpu backend: `{op}` argument `x` {:?} needs an even last dim [N, 2F]", x.shape());
    }
    if out.numel() != n * (c2 / 2) {
        bail!("cpu backend: `{op}` argument `{out_name}` {:?} must hold N*F = {n}*{} elements", out.shape(), c2 / 2);
    }
    Ok((n, c2 / 2))
}

pub(crate) fn swiglu_forward(x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
    let (_, f) = swiglu_dims("swiglu_forward", x, "out", out)?;
    let xv = f32s("swiglu_forward", "x", x)?;
    let o = f32s_mut("swiglu_forward", "out", out)?;
    let rows = (CHUNK / f).max(1);
    o.par_chunks_mut(rows * f).zip(xv.par_chunks(rows * 2 * f)).for_each(|(o, x)| swiglu_kernel(o, x, f));
    Ok(())
}

pub(crate) fn swiglu_backward(x: &DeviceTensor, d_out: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()> {
    let (_, f) = swiglu_dims("swiglu_backward", x, "d_out", d_out)?;
    same_numel("swiglu_backward", "x", x, "d_x", d_x)?;
    let (xv, dy) = (f32s("swiglu_backward", "x", x)?, f32s("swiglu_backward", "d_out", d_out)?);
    let dx = f32s_mut("swiglu_backward", "d_x", d_x)?;
    let rows = (CHUNK / f).max(1);
    dx.par_chunks_mut(rows * 2 * f)
        .zip(xv.par_chunks(rows * 2 * f).zip(dy.par_chunks(rows * f)))
        .for_each(|(dx, (x, dy))| swiglu_backward_kernel(dx, x, dy, f));
    Ok(())
}

pub(crate) fn softmax_forward(x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
    let (_, c) = rows_cols("softmax_forward", "x", x)?;
    same_numel("softmax_forward", "x", x, "out", out)?;
    let xv = f32s("softmax_forward", "x", x)?;
    let o = f32s_mut("softmax_forward", "out", out)?;
    let rows = (CHUNK / c).max(1);
    o.par_chunks_mut(rows * c).zip(xv.par_chunks(rows * c)).for_each(|(o, x)| softmax_kernel(o, x, c));
    Ok(())
}

pub(crate) fn softmax_backward(y: &DeviceTensor, d_y: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()> {
    let (_, c) = rows_cols("softmax_backward", "y", y)?;
    same_numel("softmax_backward", "y", y, "d_y", d_y)?;
    same_numel("softmax_backward", "y", y, "d_x", d_x)?;
    let (yv, dy) = (f32s("softmax_backward", "y", y)?, f32s("softmax_backward", "d_y", d_y)?);
    let dx = f32s_mut("softmax_backward", "d_x", d_x)?;
    let rows = (CHUNK / c).max(1);
    dx.par_chunks_mut(rows * c)
        .zip(yv.par_chunks(rows * c).zip(dy.par_chunks(rows * c)))
        .for_each(|(dx, (y, dy))| softmax_backward_kernel(dx, y, dy, c));
    Ok(())
}

simd_kernel! {
    fn gelu_kernel(o: &mut [f32], x: &[f32]) {
        for (o, &x) in o.iter_mut().zip(x) {
            // 0.5·(1 + tanh(u)) = sigmoid(2u): one exp and one division.
            let u2 = (2.0 * SQRT_2_OVER_PI) * (GELU_C * x * x).mul_add(x, x);
            *o = x / (1.0 + simd::exp(-u2));
        }
    }
}

simd_kernel! {
    fn gelu_backward_kernel(dx: &mut [f32], x: &[f32], dy: &[f32]) {
        for (dx, (&x, &dy)) in dx.iter_mut().zip(x.iter().zip(dy)) {
            let u = SQRT_2_OVER_PI * (x + GELU_C * x * x * x);
            let t = simd::tanh(u);
            let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * x * x);
            *dx = dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du);
        }
    }
}

simd_kernel! {
    /// Rows of `x` are `[a | b]` (2F), rows of `o` are F.
    fn swiglu_kernel(o: &mut [f32], x: &[f32], f: usize) {
        for (o, x) in o.chunks_exact_mut(f).zip(x.chunks_exact(2 * f)) {
            let (a, b) = x.split_at(f);
            for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
                *o = a * simd::sigmoid(a) * b;
            }
        }
    }
}

simd_kernel! {
    fn swiglu_backward_kernel(dx: &mut [f32], x: &[f32], dy: &[f32], f: usize) {
        for (dx, (x, dy)) in dx.chunks_exact_mut(2 * f).zip(x.chunks_exact(2 * f).zip(dy.chunks_exact(f))) {
            let (a, b) = x.split_at(f);
            let (da, db) = dx.split_at_mut(f);
            for ((da, db), ((&a, &b), &g)) in da.iter_mut().zip(db).zip(a.iter().zip(b).zip(dy)) {
                let s = simd::sigmoid(a);
                *da = g * b * s * (1.0 + a * (1.0 - s));
                *db = g * a * s;
            }
        }
    }
}

simd_kernel! {
    fn softmax_kernel(o: &mut [f32], x: &[f32], c: usize) {
        for (o, x) in o.chunks_exact_mut(c).zip(x.chunks_exact(c)) {
            let m = simd::max(x);
            // A row of all -inf (fully masked) gives zeros instead of NaN.
            let m = if m == f32::NEG_INFINITY { 0.0 } else { m };
            o.iter_mut().zip(x).for_each(|(o, &x)| *o = simd::exp(x - m));
            let s = simd::sum_map(o, |v| v);
            let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
            o.iter_mut().for_each(|o| *o *= inv);
        }
    }
}

simd_kernel! {
    fn softmax_backward_kernel(dx: &mut [f32], y: &[f32], dy: &[f32], c: usize) {
        for (dx, (y, dy)) in dx.chunks_exact_mut(c).zip(y.chunks_exact(c).zip(dy.chunks_exact(c))) {
            let d = simd::sum_map2(y, dy, |a, b| a * b);
            dx.iter_mut().zip(y.iter().zip(dy)).for_each(|(dx, (&y, &dy))| *dx = y * (dy - d));
        }
    }
}
