//! Causal depthwise conv1d + SiLU (Mamba-2's conv on xBC), forward and backward side by side.
//! Rows `r = b·T + t` of `(B·T, Ch)`; the weight is transposed once to `(K, Ch)` so every tap
//! is a contiguous, vectorised pass over the channels. Forward: blocks of [`ROWS`] rows in
//! parallel (no reduction). Backward: `d pre` first (parallel), then per block `d x` and the
//! block's partial `d w`, `d bias`, added in block order (fixed blocks: the result does not
//! depend on the thread count).
//!
//! Cached by forward for backward: `pre (B, T, Ch)` (before the SiLU).

use crate::check::{f32s, f32s_mut, numel};
use crate::elementwise::{add_into, ordered_reduce};
use crate::simd;
use crate::simd_kernel;
use megatron_core::{Conv1dSpec, DeviceTensor, Result};
use rayon::prelude::*;

/// Rows per parallel task.
const ROWS: usize = 64;

fn check(op: &str, s: &Conv1dSpec, x: &DeviceTensor, w: &DeviceTensor) -> Result<()> {
    if s.width == 0 || s.channels == 0 {
        megatron_core::anyhow::bail!("cpu backend: `{op}` needs width >= 1 and channels >= 1, got {s:?}");
    }
    numel(op, "x", x, s.batch * s.seq * s.channels, "(batch, seq, channels)")?;
    numel(op, "weight", w, s.channels * s.width, "(channels, width)")
}

/// `(K, Ch)` from `(Ch, K)`.
fn transpose_weight(w: &[f32], ch: usize, k: usize) -> Vec<f32> {
    let mut wt = vec![0.0f32; k * ch];
    crate::tile::transpose_into(w, 0, k, ch, k, &mut wt, ch);
    wt
}

pub(crate) fn forward(
    x: &DeviceTensor,
    weight: &DeviceTensor,
    bias: &DeviceTensor,
    out: &mut DeviceTensor,
    pre: &mut DeviceTensor,
    s: Conv1dSpec,
) -> Result<()> {
    const OP: &str = "causal_conv1d_silu_forward";
    check(OP, &s, x, weight)?;
    numel(OP, "bias", bias, s.channels, "(channels)")?;
    numel(OP, "out", out, x.numel(), "the shape of `x`")?;
    numel(OP, "pre", pre, x.numel(), "the shape of `x`")?;
    let (xv, bv) = (f32s(OP, "x", x)?, f32s(OP, "bias", bias)?);
    let wt = transpose_weight(f32s(OP, "weight", weight)?, s.channels, s.width);
    let (o, p) = (f32s_mut(OP, "out", out)?, f32s_mut(OP, "pre", pre)?);
    let blk = ROWS * s.channels;
    o.par_chunks_mut(blk).zip(p.par_chunks_mut(blk)).enumerate().for_each(|(i, (o, p))| {
        forward_kernel(o, p, xv, &wt, bv, i * ROWS, s.seq);
    });
    Ok(())
}

simd_kernel! {
    /// Rows `r0..` of `pre` and `out` (as many as `pre` holds).
    fn forward_kernel(o: &mut [f32], pre: &mut [f32], x: &[f32], wt: &[f32], bias: &[f32], r0: usize, seq: usize) {
        let ch = bias.len();
        let k = wt.len() / ch;
        for (i, (o, p)) in o.chunks_exact_mut(ch).zip(pre.chunks_exact_mut(ch)).enumerate() {
            let (r, t) = (r0 + i, (r0 + i) % seq);
            p.copy_from_slice(bias);
            for j in 0..k {
                // tap j reads step t + j − (K−1) of the same batch row
                let back = k - 1 - j;
                if back > t {
                    continue;
                }
                let xs = &x[(r - back) * ch..(r - back + 1) * ch];
                for ((pv, &wv), &xv) in p.iter_mut().zip(&wt[j * ch..(j + 1) * ch]).zip(xs) {
                    *pv += wv * xv;
                }
            }
            for (ov, &pv) in o.iter_mut().zip(p.iter()) {
                *ov = pv * simd::sigmoid(pv);
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    x: &DeviceTensor,
    weight: &DeviceTensor,
    pre: &DeviceTensor,
    d_out: &DeviceTensor,
    d_x: &mut DeviceTensor,
    d_weight: &mut DeviceTensor,
    d_bias: &mut DeviceTensor,
    s: Conv1dSpec,
) -> Result<()> {
    const OP: &str = "causal_conv1d_silu_backward";
    check(OP, &s, x, weight)?;
    for (name, t) in [("pre", pre), ("d_out", d_out)] {
        numel(OP, name, t, x.numel(), "the shape of `x`")?;
    }
    numel(OP, "d_x", d_x, x.numel(), "the shape of `x`")?;
    numel(OP, "d_weight", d_weight, s.channels * s.width, "(channels, width)")?;
    numel(OP, "d_bias", d_bias, s.channels, "(channels)")?;
    let (ch, k) = (s.channels, s.width);
    let (xv, pv, gv) = (f32s(OP, "x", x)?, f32s(OP, "pre", pre)?, f32s(OP, "d_out", d_out)?);
    let wt = transpose_weight(f32s(OP, "weight", weight)?, ch, k);
    let blk = ROWS * ch;
    let mut d_pre = vec![0.0f32; xv.len()];
    d_pre.par_chunks_mut(blk).zip(pv.par_chunks(blk).zip(gv.par_chunks(blk))).for_each(|(d, (p, g))| {
        silu_backward_kernel(d, p, g);
    });
    let dx = f32s_mut(OP, "d_x", d_x)?;
    // Per block: its rows of d x and its partial (d wᵀ (K, Ch) | d bias (Ch)).
    let partial = ordered_reduce(
        dx.par_chunks_mut(blk).enumerate(),
        |(i, dx)| {
            let mut acc = vec![0.0f32; (k + 1) * ch];
            backward_kernel(dx, &mut acc, xv, &d_pre, &wt, i * ROWS, s.seq);
            acc
        },
        |mut a, b| {
            add_into(&mut a, &b);
            a
        },
    );
    if let Some(acc) = partial {
        let dw = f32s_mut(OP, "d_weight", d_weight)?;
        for c in 0..ch {
            for j in 0..k {
                dw[c * k + j] += acc[j * ch + c];
            }
        }
        add_into(f32s_mut(OP, "d_bias", d_bias)?, &acc[k * ch..]);
    }
    Ok(())
}

simd_kernel! {
    fn silu_backward_kernel(d: &mut [f32], pre: &[f32], g: &[f32]) {
        for ((d, &p), &g) in d.iter_mut().zip(pre).zip(g) {
            let sg = simd::sigmoid(p);
            *d = g * sg * (1.0 + p * (1.0 - sg));
        }
    }
}

simd_kernel! {
    /// Rows `r0..` of `dx` (overwritten); adds this block's `d wᵀ (K, Ch)` and `d bias (Ch)`
    /// into `acc ((K + 1) · Ch)`.
    fn backward_kernel(dx: &mut [f32], acc: &mut [f32], x: &[f32], d_pre: &[f32], wt: &[f32], r0: usize, seq: usize) {
        let ch = acc.len() - wt.len();
        let k = wt.len() / ch;
        let (dwt, db) = acc.split_at_mut(k * ch);
        for (i, dx) in dx.chunks_exact_mut(ch).enumerate() {
            let (r, t) = (r0 + i, (r0 + i) % seq);
            let g = &d_pre[r * ch..(r + 1) * ch];
            dx.fill(0.0);
            for (dbv, &gv) in db.iter_mut().zip(g) {
                *dbv += gv;
            }
            for j in 0..k {
                let back = k - 1 - j;
                let w = &wt[j * ch..(j + 1) * ch];
                // x[r] feeds pre[r + back] through tap j
                if t + back < seq {
                    let gf = &d_pre[(r + back) * ch..(r + back + 1) * ch];
                    for ((dv, &wv), &gv) in dx.iter_mut().zip(w).zip(gf) {
                        *dv += wv * gv;
                    }
                }
                // pre[r] reads x[r − back] through tap j
                if back <= t {
                    let xs = &x[(r - back) * ch..(r - back + 1) * ch];
                    for ((dwv, &xv), &gv) in dwt[j * ch..(j + 1) * ch].iter_mut().zip(xs).zip(g) {
                        *dwv += xv * gv;
                    }
                }
            }
        }
    }
}
