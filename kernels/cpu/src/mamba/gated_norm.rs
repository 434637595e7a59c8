//! Gated RMSNorm per group (mamba_ssm's `RMSNormGated`, `norm_before_gate=False`), forward and
//! backward side by side: `g = y ⊙ silu(z)`, `out = g · rstd_group ⊙ w` over `G` groups of
//! `D/G` channels per row. Blocks of [`ROWS`] rows run in parallel; `d w` is summed per block
//! and the blocks added in order (deterministic).
//!
//! Cached by forward for backward: `rstd (R, G)`.

use crate::check::{f32s, f32s_mut, numel, rows_cols};
use crate::elementwise::{add_into, ordered_reduce};
use crate::simd;
use crate::simd_kernel;
use megatron_core::anyhow::bail;
use megatron_core::{DeviceTensor, Result};
use rayon::prelude::*;

/// Rows per parallel task.
const ROWS: usize = 32;

fn dims(op: &str, y: &DeviceTensor, w: &DeviceTensor, groups: usize) -> Result<(usize, usize)> {
    let (rows, d) = rows_cols(op, "y", y)?;
    numel(op, "weight", w, d, "the last dim of `y`")?;
    if groups == 0 || !d.is_multiple_of(groups) {
        bail!("cpu backend: `{op}`: width {d} must be a multiple of groups {groups} (>= 1)");
    }
    Ok((rows, d))
}

pub(crate) fn forward(
    y: &DeviceTensor,
    z: &DeviceTensor,
    weight: &DeviceTensor,
    groups: usize,
    eps: f32,
    out: &mut DeviceTensor,
    rstd: &mut DeviceTensor,
) -> Result<()> {
    const OP: &str = "gated_rmsnorm_forward";
    let (rows, d) = dims(OP, y, weight, groups)?;
    numel(OP, "z", z, rows * d, "the shape of `y`")?;
    numel(OP, "out", out, rows * d, "the shape of `y`")?;
    numel(OP, "rstd", rstd, rows * groups, "(rows, groups)")?;
    let (yv, zv, wv) = (f32s(OP, "y", y)?, f32s(OP, "z", z)?, f32s(OP, "weight", weight)?);
    let (o, rs) = (f32s_mut(OP, "out", out)?, f32s_mut(OP, "rstd", rstd)?);
    o.par_chunks_mut(ROWS * d)
        .zip(rs.par_chunks_mut(ROWS * groups))
        .zip(yv.par_chunks(ROWS * d).zip(zv.par_chunks(ROWS * d)))
        .for_each(|((o, rs), (y, z))| forward_kernel(o, rs, y, z, wv, eps));
    Ok(())
}

simd_kernel! {
    fn forward_kernel(o: &mut [f32], rs: &mut [f32], y: &[f32], z: &[f32], w: &[f32], eps: f32) {
        let d = w.len();
        let groups = rs.len() / (o.len() / d).max(1);
        let gs = d / groups;
        for (((o, rs), y), z) in o.chunks_exact_mut(d).zip(rs.chunks_exact_mut(groups)).zip(y.chunks_exact(d)).zip(z.chunks_exact(d)) {
            // o holds the gate first, then the normalised output
            for ((ov, &yv), &zv) in o.iter_mut().zip(y).zip(z) {
                *ov = yv * zv * simd::sigmoid(zv);
            }
            for ((og, r), wg) in o.chunks_exact_mut(gs).zip(rs.iter_mut()).zip(w.chunks_exact(gs)) {
                let s = 1.0 / (simd::sum_map(og, |v| v * v) / gs as f32 + eps).sqrt();
                *r = s;
                for (ov, &wv) in og.iter_mut().zip(wg) {
                    *ov *= s * wv;
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    y: &DeviceTensor,
    z: &DeviceTensor,
    weight: &DeviceTensor,
    groups: usize,
    rstd: &DeviceTensor,
    d_out: &DeviceTensor,
    d_y: &mut DeviceTensor,
    d_z: &mut DeviceTensor,
    d_weight: &mut DeviceTensor,
) -> Result<()> {
    const OP: &str = "gated_rmsnorm_backward";
    let (rows, d) = dims(OP, y, weight, groups)?;
    for (name, t) in [("z", z), ("d_out", d_out)] {
        numel(OP, name, t, rows * d, "the shape of `y`")?;
    }
    numel(OP, "d_y", d_y, rows * d, "the shape of `y`")?;
    numel(OP, "d_z", d_z, rows * d, "the shape of `y`")?;
    numel(OP, "rstd", rstd, rows * groups, "(rows, groups)")?;
    numel(OP, "d_weight", d_weight, d, "the last dim of `y`")?;
    let (yv, zv, wv) = (f32s(OP, "y", y)?, f32s(OP, "z", z)?, f32s(OP, "weight", weight)?);
    let (rv, gv) = (f32s(OP, "rstd", rstd)?, f32s(OP, "d_out", d_out)?);
    let dz = f32s_mut(OP, "d_z", d_z)?;
    let dy = f32s_mut(OP, "d_y", d_y)?;
    let (b, bg) = (ROWS * d, ROWS * groups);
    let dw = ordered_reduce(
        dy.par_chunks_mut(b)
            .zip(dz.par_chunks_mut(b))
            .zip(yv.par_chunks(b).zip(zv.par_chunks(b)))
            .zip(rv.par_chunks(bg).zip(gv.par_chunks(b))),
        |(((dy, dz), (y, z)), (rs, g))| {
            let mut dw = vec![0.0f32; d];
            backward_kernel(dy, dz, &mut dw, y, z, wv, rs, g);
            dw
        },
        |mut a, b| {
            add_into(&mut a, &b);
            a
        },
    );
    if let Some(dw) = dw {
        add_into(f32s_mut(OP, "d_weight", d_weight)?, &dw);
    }
    Ok(())
}

simd_kernel! {
    /// With `gh = g·s` (normalised gate) and `dgh = d_out ⊙ w`:
    /// `d g = s (dgh − gh · mean(dgh ⊙ gh))`, `d y = d g ⊙ silu(z)`, `d z = d g ⊙ y ⊙ silu'(z)`.
    fn backward_kernel(dy: &mut [f32], dz: &mut [f32], dw: &mut [f32], y: &[f32], z: &[f32], w: &[f32], rs: &[f32], g: &[f32]) {
        let d = w.len();
        let groups = rs.len() / (y.len() / d).max(1);
        let gs = d / groups;
        for (((((dy, dz), y), z), rs), g) in dy
            .chunks_exact_mut(d)
            .zip(dz.chunks_exact_mut(d))
            .zip(y.chunks_exact(d))
            .zip(z.chunks_exact(d))
            .zip(rs.chunks_exact(groups))
            .zip(g.chunks_exact(d))
        {
            for (gi, &s) in rs.iter().enumerate() {
                let c = gi * gs..(gi + 1) * gs;
                let (yg, zg, gg, wg) = (&y[c.clone()], &z[c.clone()], &g[c.clone()], &w[c.clone()]);
                // dy holds silu(z), dz holds gh for this group while the mean is formed
                let (dyg, dzg) = (&mut dy[c.clone()], &mut dz[c.clone()]);
                for (((sv, ghv), &yv), &zv) in dyg.iter_mut().zip(dzg.iter_mut()).zip(yg).zip(zg) {
                    *sv = zv * simd::sigmoid(zv);
                    *ghv = yv * *sv * s;
                }
                for ((dwv, &gv), &ghv) in dw[c].iter_mut().zip(gg).zip(dzg.iter()) {
                    *dwv += gv * ghv;
                }
                let mean = simd::sum_map3(gg, wg, dzg, |gv, wv, ghv| gv * wv * ghv) / gs as f32;
                for (((dyv, dzv), &yv), (&zv, (&gv, &wv))) in
                    dyg.iter_mut().zip(dzg.iter_mut()).zip(yg).zip(zg.iter().zip(gg.iter().zip(wg)))
                {
                    let sg = simd::sigmoid(zv);
                    let dgv = s * (gv * wv - *dzv * mean);
                    *dyv *= dgv;
                    *dzv = dgv * yv * sg * (1.0 + zv * (1.0 - sg));
                }
            }
        }
    }
}
