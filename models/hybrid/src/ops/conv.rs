//! Causal depthwise conv1d + SiLU over `(B, T, Ch)` (Mamba-2's `conv1d` on xBC, kernel `K`,
//! with bias): `pre[t, c] = bias[c] + Σ_k w[c, k] · x[t + k − (K−1), c]` (zero before the
//! start, PyTorch's `conv1d(padding=K−1)[..., :T]`), `out = silu(pre)`.
//! Forward and backward are parallel over batch rows; the weight and bias gradients are summed
//! over rows in ascending order (deterministic).

use super::{check_len, silu, silu_grad};
use anyhow::Result;
use rayon::prelude::*;

/// Sizes: `batch` rows of `seq` steps and `channels` channels, kernel `width` (the Backend
/// op's [`megatron_core::Conv1dSpec`]).
pub use megatron_core::Conv1dSpec as ConvDims;

fn check(d: &ConvDims, x: usize, w: usize, bias: usize) -> Result<()> {
    check_len("conv x", x, d.batch * d.seq * d.channels)?;
    check_len("conv weight", w, d.channels * d.width)?;
    check_len("conv bias", bias, d.channels)
}

/// `(out, pre)`, both `(B, T, Ch)`; `pre` (before SiLU) is what backward needs.
pub fn conv_silu_forward(d: &ConvDims, x: &[f32], w: &[f32], bias: &[f32]) -> Result<(Vec<f32>, Vec<f32>)> {
    check(d, x.len(), w.len(), bias.len())?;
    let (t_len, ch, k) = (d.seq, d.channels, d.width);
    let row = t_len * ch;
    let mut pre = vec![0.0f32; d.batch * row];
    pre.par_chunks_mut(row.max(1)).zip(x.par_chunks(row.max(1))).for_each(|(pre, x)| {
        for t in 0..t_len {
            let out = &mut pre[t * ch..(t + 1) * ch];
            out.copy_from_slice(bias);
            for j in 0..k {
                // tap j reads step t + j − (K−1)
                let Some(src) = (t + j).checked_sub(k - 1) else { continue };
                let xs = &x[src * ch..(src + 1) * ch];
                for c in 0..ch {
                    out[c] += w[c * k + j] * xs[c];
                }
            }
        }
    });
    let out = pre.par_iter().map(|&v| silu(v)).collect();
    Ok((out, pre))
}

/// `(dx (B, T, Ch), dw (Ch, K), dbias (Ch))` from `d_out` and the forward's `pre`.
pub fn conv_silu_backward(
    d: &ConvDims,
    x: &[f32],
    w: &[f32],
    pre: &[f32],
    d_out: &[f32],
) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
    check(d, x.len(), w.len(), d.channels)?;
    check_len("conv pre", pre.len(), x.len())?;
    check_len("conv d_out", d_out.len(), x.len())?;
    let (t_len, ch, k) = (d.seq, d.channels, d.width);
    let row = (t_len * ch).max(1);
    let d_pre: Vec<f32> = d_out.par_iter().zip(pre).map(|(g, &p)| g * silu_grad(p)).collect();
    let mut dx = vec![0.0f32; x.len()];
    // Per row: dx and this row's partial dw, dbias.
    let partial: Vec<(Vec<f32>, Vec<f32>)> = dx
        .par_chunks_mut(row)
        .zip(x.par_chunks(row).zip(d_pre.par_chunks(row)))
        .map(|(dx, (x, dp))| {
            let (mut dw, mut db) = (vec![0.0f32; ch * k], vec![0.0f32; ch]);
            for t in 0..t_len {
                let g = &dp[t * ch..(t + 1) * ch];
                for c in 0..ch {
                    db[c] += g[c];
                }
                for j in 0..k {
                    let Some(src) = (t + j).checked_sub(k - 1) else { continue };
                    for c in 0..ch {
                        dx[src * ch + c] += w[c * k + j] * g[c];
                        dw[c * k + j] += x[src * ch + c] * g[c];
                    }
                }
            }
            (dw, db)
        })
        .collect();
    let (mut dw, mut db) = (vec![0.0f32; ch * k], vec![0.0f32; ch]);
    for (pw, pb) in partial {
        dw.iter_mut().zip(&pw).for_each(|(a, b)| *a += b);
        db.iter_mut().zip(&pb).for_each(|(a, b)| *a += b);
    }
    Ok((dx, dw, db))
}

/// Naive reference of the forward: explicit zero padding, one output element at a time.
pub fn conv_silu_reference(d: &ConvDims, x: &[f32], w: &[f32], bias: &[f32]) -> Vec<f32> {
    let (t_len, ch, k) = (d.seq, d.channels, d.width);
    let mut out = vec![0.0f32; x.len()];
    for b in 0..d.batch {
        for c in 0..ch {
            let padded: Vec<f32> =
                (0..k - 1).map(|_| 0.0).chain((0..t_len).map(|t| x[(b * t_len + t) * ch + c])).collect();
            for t in 0..t_len {
                let mut acc = bias[c] as f64;
                for j in 0..k {
                    acc += (w[c * k + j] * padded[t + j]) as f64;
                }
                out[(b * t_len + t) * ch + c] = silu(acc as f32);
            }
        }
    }
    out
}

/// One decoding step: `state (B, K−1, Ch)` holds the last `K−1` inputs (oldest first); `x_t
/// (B, Ch)` is the new one. Returns `silu(pre_t)` and shifts `x_t` into the state.
pub fn conv_silu_step(
    channels: usize,
    width: usize,
    state: &mut [f32],
    x_t: &[f32],
    w: &[f32],
    bias: &[f32],
) -> Vec<f32> {
    let (ch, k) = (channels, width);
    let batch = x_t.len() / ch.max(1);
    let mut out = vec![0.0f32; x_t.len()];
    for b in 0..batch {
        let st = &mut state[b * (k - 1) * ch..(b + 1) * (k - 1) * ch];
        let xt = &x_t[b * ch..(b + 1) * ch];
        for c in 0..ch {
            let mut acc = bias[c];
            for j in 0..k - 1 {
                acc += w[c * k + j] * st[j * ch + c];
            }
            acc += w[c * k + k - 1] * xt[c];
            out[b * ch + c] = silu(acc);
        }
        if k > 1 {
            st.copy_within(ch.., 0);
            st[(k - 2) * ch..].copy_from_slice(xt);
        }
    }
    out
}
