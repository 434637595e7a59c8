//! The SSD chunked scan of Mamba-2, forward (the backward is [`super::ssd_backward`]). Per
//! batch row and head (group `g = h / (H/G)` shares B and C), with `L_t` the inclusive cumsum
//! of `Δ A` inside a chunk of `Q` steps and `S (N, P)` the fp32 state entering it:
//! * intra-chunk (quadratic form): `Y = (C Bᵀ ∘ exp(L_t − L_s) Δ_s, masked s ≤ t) X`;
//! * inter-chunk: `Y += diag(exp L) C S`, then `S ← exp(L_end) S + (w ∘ B)ᵀ X` with
//!   `w_s = exp(L_end − L_s) Δ_s`; and the D skip `Y += D X`.
//!
//! Every product is a small GEMM through the register-blocked [`crate::tile::matmul`] (the
//! attention tiles' kernel), the masks and decays are vectorised [`crate::simd_kernel!`]
//! loops with [`crate::simd::exp`]. Work is split over `(b, h)` pairs (one task each, fixed);
//! a pair's numbers never depend on the others, so the output does not depend on the thread
//! count. Every exponent is ≤ 0 (A < 0, Δ > 0): nothing overflows.

use crate::check::{f32s, f32s_mut, numel};
use crate::simd;
use crate::simd_kernel;
use crate::tile::{matmul, transpose_into, Strided};
use megatron_core::anyhow::bail;
use megatron_core::{DeviceTensor, Result, SsdSpec, SsdTensors};
use rayon::prelude::*;

/// The scan's inputs as fp32 slices (layouts in [`megatron_core::mamba_ops`]).
pub(crate) struct Inputs<'a> {
    pub x: &'a [f32],
    pub dt: &'a [f32],
    pub a: &'a [f32],
    pub b: &'a [f32],
    pub c: &'a [f32],
    pub d: &'a [f32],
}

pub(crate) fn inputs<'a>(op: &str, s: &SsdSpec, t: &SsdTensors<'a>) -> Result<Inputs<'a>> {
    if s.groups == 0 || !s.heads.is_multiple_of(s.groups) || s.chunk == 0 {
        bail!("cpu backend: `{op}`: heads {} must be a multiple of groups {} (>= 1), chunk >= 1", s.heads, s.groups);
    }
    let bt = s.batch * s.seq;
    numel(op, "x", t.x, bt * s.heads * s.head_dim, "(batch, seq, heads, head_dim)")?;
    numel(op, "dt", t.dt, bt * s.heads, "(batch, seq, heads)")?;
    numel(op, "a", t.a, s.heads, "(heads)")?;
    numel(op, "b", t.b, bt * s.groups * s.state, "(batch, seq, groups, state)")?;
    numel(op, "c", t.c, bt * s.groups * s.state, "(batch, seq, groups, state)")?;
    numel(op, "d", t.d, s.heads, "(heads)")?;
    Ok(Inputs {
        x: f32s(op, "x", t.x)?,
        dt: f32s(op, "dt", t.dt)?,
        a: f32s(op, "a", t.a)?,
        b: f32s(op, "b", t.b)?,
        c: f32s(op, "c", t.c)?,
        d: f32s(op, "d", t.d)?,
    })
}

/// One `(b, h)` pair's slices gathered into contiguous rows.
pub(crate) struct Head {
    pub x: Vec<f32>,  // (T, P)
    pub dt: Vec<f32>, // (T)
    pub b: Vec<f32>,  // (T, N)
    pub c: Vec<f32>,  // (T, N)
    pub a: f32,
    pub d: f32,
}

pub(crate) fn gather(s: &SsdSpec, i: &Inputs, b: usize, h: usize) -> Head {
    let (t_len, hh, p, gg, n) = (s.seq, s.heads, s.head_dim, s.groups, s.state);
    let g = h / (hh / gg);
    let mut hd = Head {
        x: Vec::with_capacity(t_len * p),
        dt: Vec::with_capacity(t_len),
        b: Vec::with_capacity(t_len * n),
        c: Vec::with_capacity(t_len * n),
        a: i.a[h],
        d: i.d[h],
    };
    for t in 0..t_len {
        let row = b * t_len + t;
        hd.x.extend_from_slice(&i.x[(row * hh + h) * p..][..p]);
        hd.dt.push(i.dt[row * hh + h]);
        hd.b.extend_from_slice(&i.b[(row * gg + g) * n..][..n]);
        hd.c.extend_from_slice(&i.c[(row * gg + g) * n..][..n]);
    }
    hd
}

/// Inclusive cumsum of `Δ A` over the chunk `t0..t0 + l.len()` into `l`.
pub(crate) fn cumsum(hd: &Head, t0: usize, l: &mut [f32]) {
    let mut acc = 0.0f32;
    for (k, v) in l.iter_mut().enumerate() {
        acc += hd.dt[t0 + k] * hd.a;
        *v = acc;
    }
}

/// A row-major operand with row stride `rs`.
pub(crate) fn rm(data: &[f32], rs: usize) -> Strided<'_> {
    Strided { data, off: 0, rs, cs: 1 }
}

/// The transpose of a row-major `(rows, rs)` operand, read in place.
pub(crate) fn tr(data: &[f32], rs: usize) -> Strided<'_> {
    Strided { data, off: 0, rs: 1, cs: rs }
}

simd_kernel! {
    /// `m[t, s] *= exp(l_t − l_s) Δ_s` for `s ≤ t`, 0 above the diagonal (`m (len, ld)`).
    pub(crate) fn decay_mask(m: &mut [f32], ld: usize, l: &[f32], dt: &[f32]) {
        let len = l.len();
        for t in 0..len {
            let row = &mut m[t * ld..t * ld + len];
            let lt = l[t];
            let (lo, hi) = row.split_at_mut(t + 1);
            for ((v, &ls), &d) in lo.iter_mut().zip(&l[..=t]).zip(&dt[..=t]) {
                *v *= simd::exp(lt - ls) * d;
            }
            hi.fill(0.0);
        }
    }
}

simd_kernel! {
    /// `dst[r, :] = f_r · src[r, :]` with `f_r = exp(l_r)` (`scale_by_end = false`) or
    /// `exp(l_end − l_r) Δ_r` (`true`); rows of width `w`.
    pub(crate) fn scale_rows(dst: &mut [f32], src: &[f32], w: usize, l: &[f32], dt: &[f32], scale_by_end: bool) {
        let l_end = l[l.len() - 1];
        for (r, (d, s)) in dst.chunks_exact_mut(w).zip(src.chunks_exact(w)).take(l.len()).enumerate() {
            let f = if scale_by_end { simd::exp(l_end - l[r]) * dt[r] } else { simd::exp(l[r]) };
            for (dv, &sv) in d.iter_mut().zip(s) {
                *dv = f * sv;
            }
        }
    }
}

simd_kernel! {
    /// `y += d · x`, `s *= f`.
    pub(crate) fn skip_and_decay(y: &mut [f32], x: &[f32], d: f32, s: &mut [f32], f: f32) {
        for (yv, &xv) in y.iter_mut().zip(x) {
            *yv += d * xv;
        }
        for v in s.iter_mut() {
            *v *= f;
        }
    }
}

/// Forward of one head: `y (T, P)` and the chunk-entry states `(nc, N, P)`.
fn head_forward(s: &SsdSpec, hd: &Head, y: &mut [f32], states: &mut [f32]) {
    let (t_len, p, n, q) = (s.seq, s.head_dim, s.state, s.chunk.min(s.seq.max(1)));
    let mut st = vec![0.0f32; n * p]; // (N, P), fp32 state
    let mut l = vec![0.0f32; q];
    let mut m = vec![0.0f32; q * q]; // (Q, Q): C Bᵀ, then the masked, decayed M
    let mut bt = vec![0.0f32; n * q]; // (N, Q): the chunk's Bᵀ
    let mut sc = vec![0.0f32; q * n]; // (Q, N): scaled C or B
    for (c, t0) in (0..t_len).step_by(q).enumerate() {
        let len = q.min(t_len - t0);
        states[c * n * p..(c + 1) * n * p].copy_from_slice(&st);
        let l = &mut l[..len];
        cumsum(hd, t0, l);
        let (xc, bc, cc) =
            (&hd.x[t0 * p..(t0 + len) * p], &hd.b[t0 * n..(t0 + len) * n], &hd.c[t0 * n..(t0 + len) * n]);
        let dtc = &hd.dt[t0..t0 + len];
        let yc = &mut y[t0 * p..(t0 + len) * p];
        // M = (C Bᵀ ∘ decay, masked); Y = M X
        transpose_into(bc, 0, n, len, n, &mut bt, q);
        matmul(len, len, n, rm(cc, n), rm(&bt, q), &mut m, q, 1.0, false);
        decay_mask(&mut m, q, l, dtc);
        matmul(len, p, len, rm(&m, q), rm(xc, p), yc, p, 1.0, false);
        // inter-chunk: Y += diag(exp L) C S
        scale_rows(&mut sc, cc, n, l, dtc, false);
        matmul(len, p, n, rm(&sc, n), rm(&st, p), yc, p, 1.0, true);
        // D skip; S ← exp(L_end) S + (w ∘ B)ᵀ X
        skip_and_decay(yc, xc, hd.d, &mut st, simd::exp(l[len - 1]));
        scale_rows(&mut sc, bc, n, l, dtc, true);
        matmul(n, p, len, tr(&sc, n), rm(xc, p), &mut st, p, 1.0, true);
    }
}

pub(crate) fn forward(t: SsdTensors, y: &mut DeviceTensor, states: &mut DeviceTensor, s: SsdSpec) -> Result<()> {
    const OP: &str = "ssd_scan_forward";
    let i = inputs(OP, &s, &t)?;
    numel(OP, "y", y, i.x.len(), "the shape of `x`")?;
    numel(OP, "states", states, s.states_len(), "(batch, heads, chunks, state, head_dim)")?;
    let (hh, p) = (s.heads, s.head_dim);
    let per = s.states_len() / (s.batch * hh).max(1);
    let st = f32s_mut(OP, "states", states)?;
    if per == 0 {
        return Ok(());
    }
    let ys: Vec<Vec<f32>> = st
        .par_chunks_mut(per)
        .enumerate()
        .map(|(bh, st)| {
            let hd = gather(&s, &i, bh / hh, bh % hh);
            let mut yh = vec![0.0f32; s.seq * p];
            head_forward(&s, &hd, &mut yh, st);
            yh
        })
        .collect();
    let yv = f32s_mut(OP, "y", y)?;
    scatter_heads(yv, &ys, s.seq, hh, p);
    Ok(())
}

/// Writes per-`(b, h)` `(T, P)` blocks into `(B, T, H, P)`.
pub(crate) fn scatter_heads<V: AsRef<[f32]> + Sync>(dst: &mut [f32], per: &[V], seq: usize, heads: usize, p: usize) {
    dst.par_chunks_mut(heads * p).enumerate().for_each(|(row, d)| {
        let (b, t) = (row / seq, row % seq);
        for h in 0..heads {
            d[h * p..(h + 1) * p].copy_from_slice(&per[b * heads + h].as_ref()[t * p..(t + 1) * p]);
        }
    });
}
