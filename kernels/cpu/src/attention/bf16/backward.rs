//! bf16 attention backward, one (batch, head) per call: key tiles outer (dK, dV accumulate
//! in place), query tiles inner. Per tile, on `vdpbf16ps`: `S = scale·Q·Kᵀ`, `dP = dO·Vᵀ`
//! (fp32 tiles), then `P = exp(S − lse)`, `dS = P∘(dP − D)` in fp32, rounded to bf16 pairs for
//! `dV += Pᵀ·dO`, `dK += scale·dSᵀ·Q`, `dQ += scale·dS·K` (fp32 accumulators).

use super::super::{Layout, TILE};
use super::forward::LD;
use super::{store_row, widen_row};
use crate::expvec::exp_scale;
use crate::rng::DropoutMask;
use crate::scratch::{take, take_u32, RowWriter, Scratch};
use crate::simd;
use crate::simd_kernel;
use crate::tile_bf16::{cols_to_pairs, matmul_dp, pairs_transposed, row_pairs, rows_to_pairs, token_pairs, Pairs};
use megatron_core::AttentionSpec;

simd_kernel! {
    /// Gradients of one (b, h): writes its q, k and v rows of `d_qkv` through `dx`.
    pub(super) fn backward_head(
        x: &[u16],
        o: &[u16],
        dy: &[u16],
        lse: &[f32],
        l: &Layout,
        spec: &AttentionSpec,
        b: usize,
        h: usize,
        dx: &RowWriter<u16>,
    ) {
        let (t, hd) = (l.t, l.hd);
        let (hp, tp) = (hd.div_ceil(2), t.div_ceil(2));
        let tk = t.next_multiple_of(16) + 16;
        let n = 2 * t * hp + 2 * hp * tk + 3 * tp * hd + t + 2 * hd + 3 * t * hd + 2 * TILE * LD + 3 * TILE * TILE;
        let mut scratch = Scratch::get(n);
        let mut rest = scratch.as_mut();
        let (qo, ko, vo, go) = (l.qkv(b, h, 0, 0), l.qkv(b, h, 0, 1), l.qkv(b, h, 0, 2), l.o(b, h, 0));
        let qa = take_u32(&mut rest, t * hp); // Q pair rows (T, hd/2)
        row_pairs(x, qo, l.rs, t, hd, qa);
        let ga = take_u32(&mut rest, t * hp); // dO pair rows (T, hd/2)
        row_pairs(dy, go, l.rs_o, t, hd, ga);
        let kt = take_u32(&mut rest, hp * tk); // Kᵀ pair columns (hd/2, T)
        pairs_transposed(x, ko, l.rs, t, hd, kt, tk);
        let vt = take_u32(&mut rest, hp * tk); // Vᵀ pair columns (hd/2, T)
        pairs_transposed(x, vo, l.rs, t, hd, vt, tk);
        let qp = take_u32(&mut rest, tp * hd); // Q token pairs (T/2, hd)
        token_pairs(x, qo, l.rs, t, hd, qp);
        let kp = take_u32(&mut rest, tp * hd); // K token pairs (T/2, hd)
        token_pairs(x, ko, l.rs, t, hd, kp);
        let gp = take_u32(&mut rest, tp * hd); // dO token pairs (T/2, hd)
        token_pairs(dy, go, l.rs_o, t, hd, gp);
        // D_i = Σ_d dO_id O_id  (T), from the widened bf16 rows.
        let d = take(&mut rest, t);
        let (wg, wo) = (take(&mut rest, hd), take(&mut rest, hd));
        for (i, di) in d.iter_mut().enumerate() {
            let off = l.o(b, h, i);
            widen_row(&dy[off..off + hd], wg);
            widen_row(&o[off..off + hd], wo);
            *di = simd::sum_map2(wg, wo, |a, b| a * b);
        }
        let grads = take(&mut rest, 3 * t * hd); // (3, T, hd): dq, dk, dv
        grads.fill(0.0);
        let ops = Ops { qa, ga, kt, vt, tk, qp, kp, gp, d, lse };
        head_tiles(&ops, l, spec, b, h, grads, rest);
        for (slot, part) in grads.chunks_exact(t * hd).enumerate() {
            for (i, row) in part.chunks_exact(hd).enumerate() {
                // SAFETY: the q/k/v rows of head (b, h) are written only by this task.
                store_row(row, unsafe { dx.row_mut(l.qkv(b, h, i, slot), hd) });
            }
        }
    }
}

/// The packed per-head operands of the tile loop.
struct Ops<'a> {
    qa: &'a [u32],
    ga: &'a [u32],
    kt: &'a [u32],
    vt: &'a [u32],
    /// Row stride of `kt`/`vt`.
    tk: usize,
    qp: &'a [u32],
    kp: &'a [u32],
    gp: &'a [u32],
    d: &'a [f32],
    lse: &'a [f32],
}

/// Accumulates dq, dk, dv `(3, T, hd)` of one head over all (key tile, query tile) pairs.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn head_tiles(p: &Ops, l: &Layout, spec: &AttentionSpec, b: usize, h: usize, grads: &mut [f32], scratch: &mut [f32]) {
    let (t, hd, hp, scale) = (l.t, l.hd, l.hd.div_ceil(2), spec.scale);
    let mask = (spec.dropout_p > 0.0).then(|| DropoutMask::new(spec.dropout_seed, spec.dropout_p));
    let (dq, rest) = grads.split_at_mut(t * hd);
    let (dk, dv) = rest.split_at_mut(t * hd);
    let mut rest = scratch;
    let s = take(&mut rest, TILE * LD); // P (qn, kn), f32
    let dp = take(&mut rest, TILE * LD); // dP, then dS (qn, kn), f32
    let pt = take_u32(&mut rest, TILE * TILE / 2); // (dropped) P pairs across queries (qn/2, kn)
    let dst = take_u32(&mut rest, TILE * TILE / 2); // dS pairs across queries (qn/2, kn)
    let dsa = take_u32(&mut rest, TILE * TILE / 2); // dS pair rows (qn, kn/2)
    let fac = take(&mut rest, TILE); // dropout factors of one row
    for ks in (0..t).step_by(TILE) {
        let kn = TILE.min(t - ks);
        let kpn = kn.div_ceil(2);
        // Causal: query tiles before this key tile see none of its keys.
        let q_first = if spec.causal { ks } else { 0 };
        for qs in (q_first..t).step_by(TILE) {
            let qn = TILE.min(t - qs);
            let qpn = qn.div_ceil(2);
            let kt = Pairs { data: p.kt, off: ks, rs: p.tk, cs: 1 };
            let vt = Pairs { data: p.vt, off: ks, rs: p.tk, cs: 1 };
            matmul_dp(qn, kn, hp, Pairs { data: p.qa, off: qs * hp, rs: hp, cs: 1 }, kt, s, LD, scale, false);
            matmul_dp(qn, kn, hp, Pairs { data: p.ga, off: qs * hp, rs: hp, cs: 1 }, vt, dp, LD, 1.0, false);
            for r in 0..qn {
                let srow = &mut s[r * LD..r * LD + kn];
                if spec.causal {
                    srow[(qs + r + 1).saturating_sub(ks).min(kn)..].fill(f32::NEG_INFINITY);
                }
                exp_scale(srow, p.lse[qs + r], 1.0);
                let dprow = &mut dp[r * LD..r * LD + kn];
                let di = p.d[qs + r];
                if let Some(mask) = &mask {
                    // P_drop = P∘f feeds dV; dP = dP_drop∘f feeds dS (P itself, undropped).
                    for (c, f) in fac[..kn].iter_mut().enumerate() {
                        *f = mask.factor(l.mask_index(b, h, qs + r, ks + c));
                    }
                    for ((g, &pv), &f) in dprow.iter_mut().zip(srow.iter()).zip(fac.iter()) {
                        *g = pv * (*g * f - di);
                    }
                    srow.iter_mut().zip(fac.iter()).for_each(|(pv, &f)| *pv *= f);
                } else {
                    dprow.iter_mut().zip(srow.iter()).for_each(|(g, &pv)| *g = pv * (*g - di));
                }
            }
            cols_to_pairs(s, LD, qn, kn, pt);
            cols_to_pairs(dp, LD, qn, kn, dst);
            rows_to_pairs(dp, LD, qn, kn, dsa);
            let at_q = |data| Pairs { data, off: qs / 2 * hd, rs: hd, cs: 1 };
            let across = |data| Pairs { data, off: 0, rs: 1, cs: kn };
            matmul_dp(kn, hd, qpn, across(pt), at_q(p.gp), &mut dv[ks * hd..], hd, 1.0, true);
            matmul_dp(kn, hd, qpn, across(dst), at_q(p.qp), &mut dk[ks * hd..], hd, scale, true);
            let kpairs = Pairs { data: p.kp, off: ks / 2 * hd, rs: hd, cs: 1 };
            matmul_dp(
                qn,
                hd,
                kpn,
                Pairs { data: dsa, off: 0, rs: kpn, cs: 1 },
                kpairs,
                &mut dq[qs * hd..],
                hd,
                scale,
                true,
            );
        }
    }
}
