//! Gated RMSNorm of the mixer output (mamba_ssm's `RMSNormGated`, `norm_before_gate=False`):
//! `g = y ⊙ silu(z)`, then RMSNorm of `g` over each of `G` channel groups of size `D/G`,
//! times `weight (D)`. Rows `(R = B·T, D)`. The per-(row, group) `rstd (R, G)` is saved for
//! backward. Parallel over rows; `d weight` is summed over fixed blocks of rows in order.

use super::{check_len, silu, silu_grad};
use anyhow::{bail, Result};
use rayon::prelude::*;

/// Rows per block of the weight-gradient reduction (fixed, never the thread count).
const BLOCK: usize = 64;

fn dims(y: usize, w: usize, groups: usize) -> Result<(usize, usize)> {
    if w == 0 || groups == 0 || !w.is_multiple_of(groups) || !y.is_multiple_of(w) {
        bail!("gated rmsnorm: width {w} must be a multiple of groups {groups} and divide the input ({y} elements)");
    }
    Ok((y / w, w / groups))
}

/// `(out (R, D), rstd (R, G))`.
pub fn gated_rmsnorm_forward(y: &[f32], z: &[f32], w: &[f32], groups: usize, eps: f32) -> Result<(Vec<f32>, Vec<f32>)> {
    let (_, gs) = dims(y.len(), w.len(), groups)?;
    check_len("gated norm z", z.len(), y.len())?;
    let d = w.len();
    let mut out = vec![0.0f32; y.len()];
    let mut rstd = vec![0.0f32; y.len() / d * groups];
    out.par_chunks_mut(d).zip(rstd.par_chunks_mut(groups)).enumerate().for_each(|(r, (o, rs))| {
        for (g, rs) in rs.iter_mut().enumerate() {
            let cols = g * gs..(g + 1) * gs;
            let gate: Vec<f32> = cols.clone().map(|j| y[r * d + j] * silu(z[r * d + j])).collect();
            let ms = gate.iter().map(|v| v * v).sum::<f32>() / gs as f32;
            let s = 1.0 / (ms + eps).sqrt();
            *rs = s;
            for (k, j) in cols.enumerate() {
                o[j] = gate[k] * s * w[j];
            }
        }
    });
    Ok((out, rstd))
}

/// `(dy, dz, dw)` from `d_out (R, D)` and the forward's `rstd`.
pub fn gated_rmsnorm_backward(
    y: &[f32],
    z: &[f32],
    w: &[f32],
    groups: usize,
    rstd: &[f32],
    d_out: &[f32],
) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
    let (rows, gs) = dims(y.len(), w.len(), groups)?;
    check_len("gated norm d_out", d_out.len(), y.len())?;
    check_len("gated norm rstd", rstd.len(), rows * groups)?;
    let d = w.len();
    let mut dy = vec![0.0f32; y.len()];
    let mut dz = vec![0.0f32; y.len()];
    let blocks: Vec<Vec<f32>> = dy
        .par_chunks_mut(BLOCK * d)
        .zip(dz.par_chunks_mut(BLOCK * d))
        .enumerate()
        .map(|(blk, (dyb, dzb))| {
            let mut dw = vec![0.0f32; d];
            for (i, (dyr, dzr)) in dyb.chunks_mut(d).zip(dzb.chunks_mut(d)).enumerate() {
                let r = blk * BLOCK + i;
                for g in 0..groups {
                    let s = rstd[r * groups + g];
                    let cols = g * gs..(g + 1) * gs;
                    // gh = g·s (normalised gate), dgh = d_out·w; d g = s (dgh − gh·mean(dgh·gh)).
                    let mut dot = 0.0f32;
                    for j in cols.clone() {
                        let gh = y[r * d + j] * silu(z[r * d + j]) * s;
                        let dgh = d_out[r * d + j] * w[j];
                        dw[j] += d_out[r * d + j] * gh;
                        dot += dgh * gh;
                    }
                    let mean = dot / gs as f32;
                    for j in cols {
                        let (yv, zv) = (y[r * d + j], z[r * d + j]);
                        let gh = yv * silu(zv) * s;
                        let dg = s * (d_out[r * d + j] * w[j] - gh * mean);
                        dyr[j] = dg * silu(zv);
                        dzr[j] = dg * yv * silu_grad(zv);
                    }
                }
            }
            dw
        })
        .collect();
    let mut dw = vec![0.0f32; d];
    for b in blocks {
        dw.iter_mut().zip(&b).for_each(|(a, v)| *a += v);
    }
    Ok((dy, dz, dw))
}
