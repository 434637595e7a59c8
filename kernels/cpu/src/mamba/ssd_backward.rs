//! Backward of the SSD chunked scan ([`super::ssd`]). Per `(b, h)` the chunks are walked in
//! reverse carrying `dS = ∂loss/∂S_next`; with `W[t, s] = exp(L_t − L_s)` (s ≤ t),
//! `G = C Bᵀ`, `M = G ∘ W ∘ Δ_s`, `dM = dY Xᵀ`, `e_t = exp(L_t)`, `w_s = exp(L_end − L_s) Δ_s`:
//! * intra: `dX += Mᵀ dY`; `dG = dM ∘ W ∘ Δ_s` gives `dC += dG B`, `dB += dGᵀ C`;
//!   `dΔ_s += Σ_t dM G W`; `∂L_t += Σ_s q`, `∂L_s −= Σ_t q` with `q = dM ∘ M`.
//! * inter: with `dYe = diag(e) dY`: `dC += dYe Sᵀ`, `dS_prev = exp(L_end) dS + Cᵀ dYe`,
//!   `∂L_t += dYe_t · (C S)_t`.
//! * state passing: `dBw = X dSᵀ` gives `dB_s += w_s dBw_s`, `dX += (w ∘ B) dS`, and with
//!   `r_s = B_s · dBw_s`: `dΔ_s += exp(L_end − L_s) r_s`, `∂L_end += w_s r_s + exp(L_end)⟨dS, S⟩`,
//!   `∂L_s −= w_s r_s`.
//! * D skip: `dX += D dY`, `dD += Σ dY ∘ X`; then `L = cumsum(Δ A)` gives `dΔ`, `dA`.
//!
//! Products are [`crate::tile::matmul`] GEMMs; one task per `(b, h)` pair; the per-head dB/dC
//! of a group and dA/dD are summed in ascending `(b, h)` order (thread-count independent).

use super::ssd::{cumsum, gather, inputs, rm, scale_rows, scatter_heads, tr, Head};
use crate::check::{f32s, f32s_mut, numel};
use crate::simd;
use crate::simd_kernel;
use crate::tile::{matmul, transpose_into};
use megatron_core::{DeviceTensor, Result, SsdGradTensors, SsdSpec, SsdTensors};
use rayon::prelude::*;

/// One head's gradients: `x (T, P)`, `dt (T)`, `b`, `c (T, N)`, `a`, `d`.
struct HeadGrads {
    x: Vec<f32>,
    dt: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    a: f32,
    d: f32,
}

simd_kernel! {
    /// From `dm` (in: `dY Xᵀ`, out: `dG = dM ∘ W ∘ Δ_s`) and `g` (in: `C Bᵀ`, out: `M`), both
    /// `(len, ld)` and zero above the diagonal on return: adds `Σ_t dM G W` into `ddt`,
    /// `Σ_s q` into `dl_t` and `−Σ_t q` into `dl_s` (`q = dM ∘ M`).
    fn intra_grads(dm: &mut [f32], g: &mut [f32], ld: usize, l: &[f32], dt: &[f32], ddt: &mut [f32], dl: &mut [f32], col: &mut [f32]) {
        let len = l.len();
        col[..len].fill(0.0);
        for t in 0..len {
            let lt = l[t];
            let (dmr, gr) = (&mut dm[t * ld..t * ld + len], &mut g[t * ld..t * ld + len]);
            let mut row_q = 0.0f32;
            for s in 0..=t {
                let w = simd::exp(lt - l[s]);
                let (dmv, gv) = (dmr[s], gr[s]);
                let gw = gv * w;
                ddt[s] += dmv * gw;
                let m = gw * dt[s];
                let q = dmv * m;
                row_q += q;
                col[s] += q;
                gr[s] = m;
                dmr[s] = dmv * w * dt[s];
            }
            dmr[t + 1..].fill(0.0);
            gr[t + 1..].fill(0.0);
            dl[t] += row_q;
        }
        for (d, &c) in dl.iter_mut().zip(&col[..len]) {
            *d -= c;
        }
    }
}

simd_kernel! {
    /// D skip and the inter-chunk `∂L_t += dYe_t · Z_t`: `dye = diag(e) dY`, `dx += D dY`;
    /// returns `Σ dY ∘ X`.
    fn inter_rows(dye: &mut [f32], dy: &[f32], x: &[f32], z: &[f32], dx: &mut [f32], l: &[f32], dl: &mut [f32], d: f32) -> f32 {
        let p = dy.len() / l.len();
        let mut dd = 0.0f32;
        for t in 0..l.len() {
            let e = simd::exp(l[t]);
            let r = t * p..(t + 1) * p;
            let (dyt, xt) = (&dy[r.clone()], &x[r.clone()]);
            for ((a, &g), dxv) in dye[r.clone()].iter_mut().zip(dyt).zip(dx[r.clone()].iter_mut()) {
                *a = e * g;
                *dxv += d * g;
            }
            dd += simd::sum_map2(dyt, xt, |a, b| a * b);
            dl[t] += simd::sum_map2(&dye[r.clone()], &z[r], |a, b| a * b);
        }
        dd
    }
}

simd_kernel! {
    /// State passing: from `dbw = X dSᵀ (len, N)`: `db += w_s dbw`, `ddt`, `dl` (see module docs).
    fn state_grads(dbw: &[f32], b: &[f32], db: &mut [f32], l: &[f32], dt: &[f32], ddt: &mut [f32], dl: &mut [f32]) {
        let len = l.len();
        let n = b.len() / len;
        let l_end = l[len - 1];
        let mut end = 0.0f32;
        for s in 0..len {
            let e = simd::exp(l_end - l[s]);
            let w = e * dt[s];
            let r = s * n..(s + 1) * n;
            let rs = simd::sum_map2(&b[r.clone()], &dbw[r.clone()], |x, y| x * y);
            for (dbv, &g) in db[r.clone()].iter_mut().zip(&dbw[r]) {
                *dbv += w * g;
            }
            ddt[s] += e * rs;
            end += w * rs;
            dl[s] -= w * rs;
        }
        dl[len - 1] += end;
    }
}

fn head_backward(s: &SsdSpec, hd: &Head, dy: &[f32], states: &[f32]) -> HeadGrads {
    let (t_len, p, n, q) = (s.seq, s.head_dim, s.state, s.chunk.min(s.seq.max(1)));
    let mut g = HeadGrads {
        x: vec![0.0; t_len * p],
        dt: vec![0.0; t_len],
        b: vec![0.0; t_len * n],
        c: vec![0.0; t_len * n],
        a: 0.0,
        d: 0.0,
    };
    let mut ds = vec![0.0f32; n * p]; // ∂loss/∂S_next of the chunk being processed
    let mut ds_prev = vec![0.0f32; n * p];
    let (mut l, mut dl, mut col) = (vec![0.0f32; q], vec![0.0f32; q], vec![0.0f32; q]);
    let (mut gm, mut dm) = (vec![0.0f32; q * q], vec![0.0f32; q * q]);
    let mut bt = vec![0.0f32; n * q]; // (N, Q)
    let mut xt = vec![0.0f32; p * q]; // (P, Q)
    let mut dst = vec![0.0f32; p * n]; // (P, N): dSᵀ, then S_prevᵀ
    let (mut dye, mut z) = (vec![0.0f32; q * p], vec![0.0f32; q * p]);
    let (mut bw, mut dbw) = (vec![0.0f32; q * n], vec![0.0f32; q * n]);
    let nc = t_len.div_ceil(q);
    for c in (0..nc).rev() {
        let t0 = c * q;
        let len = q.min(t_len - t0);
        let s_prev = &states[c * n * p..(c + 1) * n * p];
        let (l, dl) = (&mut l[..len], &mut dl[..len]);
        cumsum(hd, t0, l);
        dl.fill(0.0);
        let rows = |w: usize| t0 * w..(t0 + len) * w;
        let (xc, bc, cc, dtc) = (&hd.x[rows(p)], &hd.b[rows(n)], &hd.c[rows(n)], &hd.dt[t0..t0 + len]);
        let dyc = &dy[t0 * p..(t0 + len) * p];
        let (gx, gdt) = (&mut g.x[t0 * p..(t0 + len) * p], &mut g.dt[t0..t0 + len]);
        let (gb, gc) = (&mut g.b[t0 * n..(t0 + len) * n], &mut g.c[t0 * n..(t0 + len) * n]);
        // State passing (uses dS = ∂/∂S_next and S_prev).
        let decay = simd::exp(l[len - 1]);
        dl[len - 1] += decay * simd::sum_map2(&ds, s_prev, |a, b| a * b);
        transpose_into(&ds, 0, p, n, p, &mut dst, n);
        matmul(len, n, p, rm(xc, p), rm(&dst, n), &mut dbw, n, 1.0, false);
        state_grads(&dbw[..len * n], bc, gb, l, dtc, gdt, dl);
        scale_rows(&mut bw, bc, n, l, dtc, true);
        matmul(len, p, n, rm(&bw, n), rm(&ds, p), gx, p, 1.0, true);
        // Intra-chunk.
        transpose_into(bc, 0, n, len, n, &mut bt, q);
        matmul(len, len, n, rm(cc, n), rm(&bt, q), &mut gm, q, 1.0, false);
        transpose_into(xc, 0, p, len, p, &mut xt, q);
        matmul(len, len, p, rm(dyc, p), rm(&xt, q), &mut dm, q, 1.0, false);
        intra_grads(&mut dm, &mut gm, q, l, dtc, gdt, dl, &mut col);
        matmul(len, p, len, tr(&gm, q), rm(dyc, p), gx, p, 1.0, true);
        matmul(len, n, len, rm(&dm, q), rm(bc, n), gc, n, 1.0, true);
        matmul(len, n, len, tr(&dm, q), rm(cc, n), gb, n, 1.0, true);
        // Inter-chunk and D skip: Z = C S_prev.
        matmul(len, p, n, rm(cc, n), rm(s_prev, p), &mut z, p, 1.0, false);
        g.d += inter_rows(&mut dye[..len * p], dyc, xc, &z[..len * p], gx, l, dl, hd.d);
        transpose_into(s_prev, 0, p, n, p, &mut dst, n);
        matmul(len, n, p, rm(&dye, p), rm(&dst, n), gc, n, 1.0, true);
        ds_prev.iter_mut().zip(&ds).for_each(|(a, &b)| *a = decay * b);
        matmul(n, p, len, tr(cc, n), rm(&dye, p), &mut ds_prev, p, 1.0, true);
        // L = cumsum(Δ A): ∂a_u = Σ_{t ≥ u} ∂L_t.
        let mut acc = 0.0f32;
        for u in (0..len).rev() {
            acc += dl[u];
            gdt[u] += acc * hd.a;
            g.a += acc * dtc[u];
        }
        std::mem::swap(&mut ds, &mut ds_prev);
    }
    g
}

pub(crate) fn backward(
    t: SsdTensors,
    states: &DeviceTensor,
    dy: &DeviceTensor,
    grads: SsdGradTensors,
    s: SsdSpec,
) -> Result<()> {
    const OP: &str = "ssd_scan_backward";
    let i = inputs(OP, &s, &t)?;
    numel(OP, "dy", dy, i.x.len(), "the shape of `x`")?;
    numel(OP, "states", states, s.states_len(), "(batch, heads, chunks, state, head_dim)")?;
    for (name, g, want) in [
        ("d_x", &*grads.x, i.x.len()),
        ("d_dt", &*grads.dt, i.dt.len()),
        ("d_a", &*grads.a, s.heads),
        ("d_b", &*grads.b, i.b.len()),
        ("d_c", &*grads.c, i.c.len()),
        ("d_d", &*grads.d, s.heads),
    ] {
        numel(OP, name, g, want, "the shape of its input")?;
    }
    let (hh, p, gg, n, seq) = (s.heads, s.head_dim, s.groups, s.state, s.seq);
    let (dyv, stv) = (f32s(OP, "dy", dy)?, f32s(OP, "states", states)?);
    let per = s.states_len() / (s.batch * hh).max(1);
    let heads: Vec<HeadGrads> = if per == 0 {
        Vec::new()
    } else {
        stv.par_chunks(per)
            .enumerate()
            .map(|(bh, st)| {
                let (b, h) = (bh / hh, bh % hh);
                let hd = gather(&s, &i, b, h);
                let mut dyh = Vec::with_capacity(seq * p);
                for t in 0..seq {
                    dyh.extend_from_slice(&dyv[((b * seq + t) * hh + h) * p..][..p]);
                }
                head_backward(&s, &hd, &dyh, st)
            })
            .collect()
    };
    let xs: Vec<&[f32]> = heads.iter().map(|h| h.x.as_slice()).collect();
    scatter_heads(f32s_mut(OP, "d_x", grads.x)?, &xs, seq, hh, p);
    let (da, dd) = (f32s_mut(OP, "d_a", grads.a)?, f32s_mut(OP, "d_d", grads.d)?);
    da.fill(0.0);
    dd.fill(0.0);
    let ddt = f32s_mut(OP, "d_dt", grads.dt)?;
    for (bh, hg) in heads.iter().enumerate() {
        let (b, h) = (bh / hh, bh % hh);
        da[h] += hg.a;
        dd[h] += hg.d;
        for t in 0..seq {
            ddt[(b * seq + t) * hh + h] = hg.dt[t];
        }
    }
    // dB, dC per group: the group's heads added in ascending order, rows in parallel.
    let hpg = hh / gg;
    for (name, out, pick) in [("d_b", grads.b, 0), ("d_c", grads.c, 1)] {
        let o = f32s_mut(OP, name, out)?;
        o.par_chunks_mut(gg * n).enumerate().for_each(|(row, o)| {
            let (b, t) = (row / seq, row % seq);
            for (g, og) in o.chunks_exact_mut(n).enumerate() {
                og.fill(0.0);
                for h in g * hpg..(g + 1) * hpg {
                    let hg = &heads[b * hh + h];
                    let src = if pick == 0 { &hg.b } else { &hg.c };
                    og.iter_mut().zip(&src[t * n..(t + 1) * n]).for_each(|(a, &v)| *a += v);
                }
            }
        });
    }
    Ok(())
}
