//! Elementwise ops and reductions: fill, scale, axpy, add, sum_rows, sum_squares, abs_max and
//! dropout. Each splits its slice into [`CHUNK`]-sized pieces run in parallel by rayon, with a
//! plain contiguous loop inside that LLVM vectorises.
//!
//! Reductions never let rayon choose the order of the additions: [`ordered_reduce`] cuts the
//! input into pieces whose size is fixed by the caller (never by the pool), maps them in
//! parallel and combines the partial results left to right in index order. Rayon's own
//! `sum`/`reduce` combine along a split tree that depends on the thread count and on work
//! stealing, so the rounding (and a training run) changed with the load of the machine.

use crate::check::{f32s, f32s_mut, floats, floats_mut, in_range, numel, rows_cols, same_numel};
use crate::rng::DropoutMask;
use crate::simd_kernel;
use crate::widen::chunked;
use megatron_core::{DeviceTensor, Result};
use rayon::prelude::*;

/// Elements per parallel task: big enough to amortise rayon's ~µs scheduling cost.
pub(crate) const CHUNK: usize = 1 << 14;

/// Maps each item of `pieces` in parallel and folds the results left to right in index order:
/// the same bits whatever the pool size or the load, as long as the caller's pieces do not
/// depend on either (cut them with a constant size, never from `current_num_threads`).
pub(crate) fn ordered_reduce<I, T, M, C>(pieces: I, map: M, combine: C) -> Option<T>
where
    I: IndexedParallelIterator,
    T: Send,
    M: Fn(I::Item) -> T + Sync + Send,
    C: FnMut(T, T) -> T,
{
    // `collect` on an indexed iterator keeps the input order whatever the split was.
    let parts: Vec<T> = pieces.map(map).collect();
    parts.into_iter().reduce(combine)
}

/// `Σ f(piece)` over the [`CHUNK`]-sized pieces of `x`, added in index order (see
/// [`ordered_reduce`]).
pub(crate) fn ordered_sum(x: &[f32], f: impl Fn(&[f32]) -> f64 + Sync + Send) -> f64 {
    ordered_reduce(x.par_chunks(CHUNK), f, |a, b| a + b).unwrap_or(0.0)
}

/// `acc += b` elementwise: the combine step of vector-valued reductions.
pub(crate) fn add_into(acc: &mut [f32], b: &[f32]) {
    acc.iter_mut().zip(b).for_each(|(a, &b)| *a += b);
}

pub(crate) fn fill(t: &mut DeviceTensor, value: f32) -> Result<()> {
    chunked(floats_mut("fill", "t", t)?, false, &[], CHUNK, |_, c, _| c.fill(value));
    Ok(())
}

pub(crate) fn scale(t: &mut DeviceTensor, s: f32) -> Result<()> {
    chunked(floats_mut("scale", "t", t)?, true, &[], CHUNK, |_, c, _| scale_kernel(c, s));
    Ok(())
}

pub(crate) fn axpy(a: &mut DeviceTensor, alpha: f32, b: &DeviceTensor) -> Result<()> {
    same_numel("axpy", "a", a, "b", b)?;
    let bv = floats("axpy", "b", b)?;
    chunked(floats_mut("axpy", "a", a)?, true, &[bv], CHUNK, |_, x, y| axpy_kernel(x, alpha, y[0]));
    Ok(())
}

pub(crate) fn add(a: &DeviceTensor, b: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
    same_numel("add", "a", a, "b", b)?;
    same_numel("add", "a", a, "out", out)?;
    let (av, bv) = (floats("add", "a", a)?, floats("add", "b", b)?);
    chunked(floats_mut("add", "out", out)?, false, &[av, bv], CHUNK, |_, o, x| add_kernel(o, x[0], x[1]));
    Ok(())
}

/// `out += Σ_rows x`. Half `x` is widened one task piece at a time (exact), so the sums are
/// bit-identical to an fp32 `x` of the same values and no full-size f32 copy is made (at GPT-2
/// shapes the bias gradient of fc1 would copy `[4096, 3072]`).
pub(crate) fn sum_rows(x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
    let (n, c) = rows_cols("sum_rows", "x", x)?;
    numel("sum_rows", "out", out, c, "the last dim of `x`")?;
    let xv = floats("sum_rows", "x", x)?;
    let o = f32s_mut("sum_rows", "out", out)?;
    // Pieces of whole rows, sized by CHUNK and C only: the partial sums are the same for any pool.
    let rows_per_task = (CHUNK / c).max(1);
    let pieces = n.div_ceil(rows_per_task);
    let partial = ordered_reduce(
        (0..pieces).into_par_iter(),
        |i| {
            let r = i * rows_per_task * c..((i + 1) * rows_per_task).min(n) * c;
            let mut buf = Vec::new();
            let rows = crate::widen::chunk_f32(&xv, r, &mut buf);
            let mut acc = vec![0.0f32; c];
            sum_rows_kernel(rows, &mut acc);
            acc
        },
        |mut a, b| {
            add_into(&mut a, &b);
            a
        },
    );
    if let Some(p) = partial.filter(|_| n > 0) {
        o.iter_mut().zip(&p).for_each(|(o, &p)| *o += p);
    }
    Ok(())
}

pub(crate) fn sum_squares(x: &DeviceTensor) -> Result<f64> {
    let xv = f32s("sum_squares", "x", x)?;
    Ok(ordered_sum(xv, sum_squares_kernel))
}

pub(crate) fn abs_max(x: &DeviceTensor) -> Result<(f32, bool)> {
    let xv = f32s("abs_max", "x", x)?;
    // max and | are exact, so any combination order gives the same answer.
    Ok(xv.par_chunks(CHUNK).map(abs_max_kernel).reduce(|| (0.0, false), |a, b| (a.0.max(b.0), a.1 | b.1)))
}

pub(crate) fn dropout(x: &mut DeviceTensor, p: f32, seed: u64) -> Result<()> {
    in_range("dropout", "p", p, 0.0, 1.0)?;
    let xv = floats_mut("dropout", "x", x)?;
    if p == 0.0 {
        return Ok(());
    }
    let mask = DropoutMask::new(seed, p);
    chunked(xv, true, &[], CHUNK, |ci, c, _| dropout_kernel(c, &mask, (ci * CHUNK) as u64));
    Ok(())
}

simd_kernel! {
    fn scale_kernel(x: &mut [f32], s: f32) {
        x.iter_mut().for_each(|v| *v *= s);
    }
}

simd_kernel! {
    fn axpy_kernel(x: &mut [f32], alpha: f32, y: &[f32]) {
        x.iter_mut().zip(y).for_each(|(x, &y)| *x += alpha * y);
    }
}

simd_kernel! {
    fn add_kernel(o: &mut [f32], x: &[f32], y: &[f32]) {
        o.iter_mut().zip(x.iter().zip(y)).for_each(|(o, (&x, &y))| *o = x + y);
    }
}

simd_kernel! {
    /// `acc[C] += Σ rows[·, C]`.
    fn sum_rows_kernel(rows: &[f32], acc: &mut [f32]) {
        let c = acc.len();
        for r in rows.chunks_exact(c) {
            acc.iter_mut().zip(r).for_each(|(a, &v)| *a += v);
        }
    }
}

simd_kernel! {
    fn sum_squares_kernel(c: &[f32]) -> f64 {
        // Eight f64 lanes break the dependency chain so the loop vectorises.
        let mut acc = [0.0f64; 8];
        let mut it = c.chunks_exact(8);
        for b in &mut it {
            for (a, &v) in acc.iter_mut().zip(b) {
                *a += v as f64 * v as f64;
            }
        }
        acc.iter().sum::<f64>() + it.remainder().iter().map(|&v| v as f64 * v as f64).sum::<f64>()
    }
}

simd_kernel! {
    fn abs_max_kernel(c: &[f32]) -> (f32, bool) {
        let (mut m, mut bad) = (0.0f32, false);
        for &v in c {
            bad |= !v.is_finite();
            m = m.max(v.abs());
        }
        (m, bad)
    }
}

simd_kernel! {
    /// Element `i` of `c` has global index `base + i` in the mask stream.
    fn dropout_kernel(c: &mut [f32], mask: &DropoutMask, base: u64) {
        for (i, v) in c.iter_mut().enumerate() {
            *v *= mask.factor(base + i as u64);
        }
    }
}
