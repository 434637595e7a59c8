//! The SSD chunked scan of Mamba-2 (Dao & Gu 2024; Megatron's `mamba_chunk_scan_combined`),
//! forward and backward, in f32 on the host with an f32 state.
//!
//! Per batch row `b` and head `h` (group `g = h / (H/G)`; B and C are shared in a group):
//! `s_t = exp(Δ_t A) s_{t-1} + Δ_t B_t x_tᵀ`, `y_t = C_tᵀ s_t + D x_t` with `s` of `(N, P)`.
//! In chunks of `Q` steps, with `L_t = Σ_{u=c0..t} Δ_u A` (inclusive cumsum inside the chunk):
//! * intra-chunk (quadratic form): `y_t += Σ_{s≤t} (C_t·B_s) exp(L_t − L_s) Δ_s x_s`
//! * inter-chunk: `y_t += exp(L_t) C_tᵀ S_prev`, and the state passed on is
//!   `S_next = exp(L_end) S_prev + Σ_s exp(L_end − L_s) Δ_s B_s x_sᵀ`.
//!
//! Every exponent is ≤ 0 (A < 0, Δ > 0), so nothing overflows. The last chunk may be short
//! (sequence lengths need not be multiples of `Q`).
//!
//! The backward walks the chunks in reverse carrying `dS`; its formulas are derived next to
//! each term below. Work is split over `(b, h)` pairs (rayon); results are written back and
//! the shared gradients (dB, dC per group, dA, dD per head) summed in a fixed order, so the
//! output never depends on the thread count.

use super::{check_len, SsdDims};
use anyhow::Result;
use rayon::prelude::*;

/// The tensors of one scan. Layouts: `x (B, T, H, P)`, `dt (B, T, H)` (Δ, after softplus),
/// `a (H)` (A < 0), `bm`/`cm (B, T, G, N)`, `d (H)`.
#[derive(Clone, Copy)]
pub struct SsdInputs<'a> {
    pub x: &'a [f32],
    pub dt: &'a [f32],
    pub a: &'a [f32],
    pub bm: &'a [f32],
    pub cm: &'a [f32],
    pub d: &'a [f32],
}

/// Gradients of every input of [`SsdInputs`], same layouts.
pub struct SsdGrads {
    pub x: Vec<f32>,
    pub dt: Vec<f32>,
    pub a: Vec<f32>,
    pub bm: Vec<f32>,
    pub cm: Vec<f32>,
    pub d: Vec<f32>,
}

/// One `(b, h)` pair's slices gathered into contiguous `(T, ·)` rows.
struct Head {
    x: Vec<f32>,  // (T, P)
    dt: Vec<f32>, // (T)
    b: Vec<f32>,  // (T, N)
    c: Vec<f32>,  // (T, N)
    a: f32,
    d: f32,
}

pub(crate) fn check(dims: &SsdDims, i: &SsdInputs) -> Result<()> {
    let SsdDims { batch, seq, heads, head_dim, groups, state, chunk } = *dims;
    if groups == 0 || heads % groups != 0 || chunk == 0 {
        anyhow::bail!("ssd scan: heads {heads} must be a multiple of groups {groups} (>= 1) and chunk {chunk} >= 1");
    }
    check_len("x", i.x.len(), batch * seq * heads * head_dim)?;
    check_len("dt", i.dt.len(), batch * seq * heads)?;
    check_len("A", i.a.len(), heads)?;
    check_len("B", i.bm.len(), batch * seq * groups * state)?;
    check_len("C", i.cm.len(), batch * seq * groups * state)?;
    check_len("D", i.d.len(), heads)
}

fn gather(dims: &SsdDims, i: &SsdInputs, b: usize, h: usize) -> Head {
    let SsdDims { seq, heads, head_dim: p, groups, state: n, .. } = *dims;
    let g = h / (heads / groups);
    let mut hd = Head {
        x: vec![0.0; seq * p],
        dt: vec![0.0; seq],
        b: vec![0.0; seq * n],
        c: vec![0.0; seq * n],
        a: i.a[h],
        d: i.d[h],
    };
    for t in 0..seq {
        let row = b * seq + t;
        hd.x[t * p..(t + 1) * p].copy_from_slice(&i.x[(row * heads + h) * p..(row * heads + h + 1) * p]);
        hd.dt[t] = i.dt[row * heads + h];
        hd.b[t * n..(t + 1) * n].copy_from_slice(&i.bm[(row * groups + g) * n..(row * groups + g + 1) * n]);
        hd.c[t * n..(t + 1) * n].copy_from_slice(&i.cm[(row * groups + g) * n..(row * groups + g + 1) * n]);
    }
    hd
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Inclusive cumsum of `Δ_t A` over `t0..t1`.
fn cumsum(hd: &Head, t0: usize, t1: usize) -> Vec<f32> {
    let mut acc = 0.0f32;
    (t0..t1)
        .map(|t| {
            acc += hd.dt[t] * hd.a;
            acc
        })
        .collect()
}

/// Forward of one head: `y (T, P)` and the states entering each chunk `(nc, N, P)`.
fn head_forward(dims: &SsdDims, hd: &Head) -> (Vec<f32>, Vec<f32>) {
    let (t_len, p, n, q) = (dims.seq, dims.head_dim, dims.state, dims.chunk);
    let nc = t_len.div_ceil(q);
    let mut y = vec![0.0f32; t_len * p];
    let mut states = vec![0.0f32; nc * n * p];
    let mut s = vec![0.0f32; n * p]; // (N, P), fp32 state
    for c in 0..nc {
        let (t0, t1) = (c * q, ((c + 1) * q).min(t_len));
        states[c * n * p..(c + 1) * n * p].copy_from_slice(&s);
        let l = cumsum(hd, t0, t1);
        for t in t0..t1 {
            let yt = &mut y[t * p..(t + 1) * p];
            let ct = &hd.c[t * n..(t + 1) * n];
            // inter-chunk: exp(L_t) C_tᵀ S_prev
            let e = l[t - t0].exp();
            for (ni, &cv) in ct.iter().enumerate() {
                let w = e * cv;
                for (yv, sv) in yt.iter_mut().zip(&s[ni * p..(ni + 1) * p]) {
                    *yv += w * sv;
                }
            }
            // intra-chunk quadratic form
            for si in t0..=t {
                let m = dot(ct, &hd.b[si * n..(si + 1) * n]) * (l[t - t0] - l[si - t0]).exp() * hd.dt[si];
                for (yv, xv) in yt.iter_mut().zip(&hd.x[si * p..(si + 1) * p]) {
                    *yv += m * xv;
                }
            }
            for (yv, xv) in yt.iter_mut().zip(&hd.x[t * p..(t + 1) * p]) {
                *yv += hd.d * xv;
            }
        }
        // state passing: S = exp(L_end) S + Σ_s exp(L_end − L_s) Δ_s B_s x_sᵀ
        let l_end = l[t1 - t0 - 1];
        let decay = l_end.exp();
        s.iter_mut().for_each(|v| *v *= decay);
        for si in t0..t1 {
            let w = (l_end - l[si - t0]).exp() * hd.dt[si];
            for ni in 0..n {
                let wb = w * hd.b[si * n + ni];
                for (sv, xv) in s[ni * p..(ni + 1) * p].iter_mut().zip(&hd.x[si * p..(si + 1) * p]) {
                    *sv += wb * xv;
                }
            }
        }
    }
    (y, states)
}

/// `y (B, T, H, P)` and the chunk-entry states `(B, H, nc, N, P)` that backward needs.
pub fn ssd_forward(dims: &SsdDims, i: &SsdInputs) -> Result<(Vec<f32>, Vec<f32>)> {
    check(dims, i)?;
    let SsdDims { batch, seq, heads, head_dim: p, .. } = *dims;
    let per: Vec<(Vec<f32>, Vec<f32>)> = (0..batch * heads)
        .into_par_iter()
        .map(|bh| head_forward(dims, &gather(dims, i, bh / heads, bh % heads)))
        .collect();
    let mut y = vec![0.0f32; batch * seq * heads * p];
    let mut states = Vec::with_capacity(per.iter().map(|r| r.1.len()).sum());
    for (bh, (yh, sh)) in per.into_iter().enumerate() {
        let (b, h) = (bh / heads, bh % heads);
        for t in 0..seq {
            let dst = ((b * seq + t) * heads + h) * p;
            y[dst..dst + p].copy_from_slice(&yh[t * p..(t + 1) * p]);
        }
        states.extend(sh);
    }
    Ok((y, states))
}

/// One head's gradients: `dx (T, P)`, `ddt (T)`, `dB`, `dC (T, N)`, `dA`, `dD`.
struct HeadGrads {
    x: Vec<f32>,
    dt: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    a: f32,
    d: f32,
}

fn head_backward(dims: &SsdDims, hd: &Head, dy: &[f32], states: &[f32]) -> HeadGrads {
    let (t_len, p, n, q) = (dims.seq, dims.head_dim, dims.state, dims.chunk);
    let nc = t_len.div_ceil(q);
    let mut g = HeadGrads {
        x: vec![0.0; t_len * p],
        dt: vec![0.0; t_len],
        b: vec![0.0; t_len * n],
        c: vec![0.0; t_len * n],
        a: 0.0,
        d: 0.0,
    };
    let mut ds = vec![0.0f32; n * p]; // dL/dS_next of the chunk being processed
    for c in (0..nc).rev() {
        let (t0, t1) = (c * q, ((c + 1) * q).min(t_len));
        let len = t1 - t0;
        let s_prev = &states[c * n * p..(c + 1) * n * p];
        let l = cumsum(hd, t0, t1);
        let mut dl = vec![0.0f32; len]; // dL_t
        let l_end = l[len - 1];
        // State passing: S_next = exp(L_end) S_prev + Σ_s w_s B_s x_sᵀ, w_s = exp(L_end − L_s) Δ_s.
        let decay = l_end.exp();
        dl[len - 1] += decay * dot(&ds, s_prev);
        for si in t0..t1 {
            let e = (l_end - l[si - t0]).exp();
            let w = e * hd.dt[si];
            let xs = &hd.x[si * p..(si + 1) * p];
            let mut r = 0.0f32; // Σ_{n,p} dS[n,p] B_s[n] x_s[p]
            for ni in 0..n {
                let dsn = &ds[ni * p..(ni + 1) * p];
                let dsx = dot(dsn, xs);
                r += hd.b[si * n + ni] * dsx;
                g.b[si * n + ni] += w * dsx;
                let bw = w * hd.b[si * n + ni];
                for (gx, dv) in g.x[si * p..(si + 1) * p].iter_mut().zip(dsn) {
                    *gx += bw * dv;
                }
            }
            g.dt[si] += e * r;
            dl[len - 1] += w * r;
            dl[si - t0] -= w * r;
        }
        // dS_prev gets the decayed dS_next; the inter-chunk term adds below.
        let mut ds_prev: Vec<f32> = ds.iter().map(|v| v * decay).collect();
        for t in t0..t1 {
            let dyt = &dy[t * p..(t + 1) * p];
            let ct = &hd.c[t * n..(t + 1) * n];
            // D skip.
            g.d += dot(dyt, &hd.x[t * p..(t + 1) * p]);
            for (gx, dv) in g.x[t * p..(t + 1) * p].iter_mut().zip(dyt) {
                *gx += hd.d * dv;
            }
            // inter-chunk: y_t += e_t C_tᵀ S_prev, e_t = exp(L_t).
            let e = l[t - t0].exp();
            let mut dyu = 0.0f32;
            for ni in 0..n {
                let sp = &s_prev[ni * p..(ni + 1) * p];
                let dys = dot(dyt, sp);
                dyu += ct[ni] * dys;
                g.c[t * n + ni] += e * dys;
                let ec = e * ct[ni];
                for (dv, yv) in ds_prev[ni * p..(ni + 1) * p].iter_mut().zip(dyt) {
                    *dv += ec * yv;
                }
            }
            dl[t - t0] += e * dyu;
            // intra-chunk: y_t += M_ts x_s, M_ts = G_ts W_ts Δ_s, G = C_t·B_s, W = exp(L_t − L_s).
            for si in t0..=t {
                let bs = &hd.b[si * n..(si + 1) * n];
                let xs = &hd.x[si * p..(si + 1) * p];
                let gts = dot(ct, bs);
                let wts = (l[t - t0] - l[si - t0]).exp();
                let m = gts * wts * hd.dt[si];
                for (gx, dv) in g.x[si * p..(si + 1) * p].iter_mut().zip(dyt) {
                    *gx += m * dv;
                }
                let dm = dot(dyt, xs);
                let dg = dm * wts * hd.dt[si];
                for ni in 0..n {
                    g.c[t * n + ni] += dg * bs[ni];
                    g.b[si * n + ni] += dg * ct[ni];
                }
                g.dt[si] += dm * gts * wts;
                let dw = dm * gts * hd.dt[si] * wts; // dL/d(L_t − L_s)
                dl[t - t0] += dw;
                dl[si - t0] -= dw;
            }
        }
        // L = cumsum(Δ A): da_u = Σ_{t≥u} dL_t; Δ and A get da·A and da·Δ.
        let mut acc = 0.0f32;
        for u in (t0..t1).rev() {
            acc += dl[u - t0];
            g.dt[u] += acc * hd.a;
            g.a += acc * hd.dt[u];
        }
        ds = ds_prev;
    }
    g
}

/// Gradients of all inputs from `dy (B, T, H, P)` and the forward's `states`.
pub fn ssd_backward(dims: &SsdDims, i: &SsdInputs, states: &[f32], dy: &[f32]) -> Result<SsdGrads> {
    check(dims, i)?;
    let SsdDims { batch, seq, heads, head_dim: p, groups, state: n, .. } = *dims;
    check_len("dy", dy.len(), batch * seq * heads * p)?;
    let per_state = seq.div_ceil(dims.chunk) * n * p;
    check_len("saved states", states.len(), batch * heads * per_state)?;
    let per: Vec<HeadGrads> = (0..batch * heads)
        .into_par_iter()
        .map(|bh| {
            let (b, h) = (bh / heads, bh % heads);
            let hd = gather(dims, i, b, h);
            let mut dyh = vec![0.0f32; seq * p];
            for t in 0..seq {
                let src = ((b * seq + t) * heads + h) * p;
                dyh[t * p..(t + 1) * p].copy_from_slice(&dy[src..src + p]);
            }
            head_backward(dims, &hd, &dyh, &states[bh * per_state..(bh + 1) * per_state])
        })
        .collect();
    let mut out = SsdGrads {
        x: vec![0.0; i.x.len()],
        dt: vec![0.0; i.dt.len()],
        a: vec![0.0; heads],
        bm: vec![0.0; i.bm.len()],
        cm: vec![0.0; i.cm.len()],
        d: vec![0.0; heads],
    };
    // Fixed order: b ascending, then h ascending (the heads of a group add into its dB/dC).
    for (bh, hg) in per.into_iter().enumerate() {
        let (b, h) = (bh / heads, bh % heads);
        let grp = h / (heads / groups);
        out.a[h] += hg.a;
        out.d[h] += hg.d;
        for t in 0..seq {
            let row = b * seq + t;
            let xo = (row * heads + h) * p;
            out.x[xo..xo + p].copy_from_slice(&hg.x[t * p..(t + 1) * p]);
            out.dt[row * heads + h] = hg.dt[t];
            let go = (row * groups + grp) * n;
            for k in 0..n {
                out.bm[go + k] += hg.b[t * n + k];
                out.cm[go + k] += hg.c[t * n + k];
            }
        }
    }
    Ok(out)
}
