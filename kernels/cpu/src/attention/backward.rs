//! Attention backward, one (batch, head) per call: scores recomputed tile by tile from the
//! packed q/k and `lse`, with key tiles outer (dK, dV accumulate in place) and query tiles inner.

use super::forward::pack_rows;
use super::{apply_dropout, mask_causal, Layout, TILE};
use crate::expvec::exp_sub;
use crate::rng::DropoutMask;
use crate::scratch::{take, RowWriter, Scratch};
use crate::simd;
use crate::simd_kernel;
use crate::tile::{matmul, transpose_into, Strided};
use megatron_core::AttentionSpec;

simd_kernel! {
    /// Gradients of one (b, h): writes its q, k and v rows of `d_qkv` through `dx`.
    pub(super) fn backward_head(
        x: &[f32],
        o: &[f32],
        dy: &[f32],
        lse: &[f32],
        l: &Layout,
        spec: &AttentionSpec,
        b: usize,
        h: usize,
        dx: &RowWriter,
    ) {
        // Packed Q^T and dO^T (hd, T); the padded row stride avoids 4 KiB cache aliasing.
        let (t, hd) = (l.t, l.hd);
        let tp = t.next_multiple_of(16) + 16;
        let mut scratch = Scratch::get(2 * hd * tp + 7 * t * hd + t + 3 * TILE * TILE);
        {
            let mut rest = scratch.as_mut();
            let (qt, dot) = (take(&mut rest, hd * tp), take(&mut rest, hd * tp));
            transpose_into(x, l.qkv(b, h, 0, 0), l.rs, t, hd, qt, tp);
            transpose_into(dy, l.o(b, h, 0), l.rs_o, t, hd, dot, tp);
            // Contiguous (T, hd) copies of the rows the products stream.
            let rows = [
                (x, l.qkv(b, h, 0, 0), l.rs),
                (x, l.qkv(b, h, 0, 1), l.rs),
                (x, l.qkv(b, h, 0, 2), l.rs),
                (dy, l.o(b, h, 0), l.rs_o),
            ];
            let [q_rows, k_rows, v_rows, g_rows] = rows.map(|(src, off, rs)| {
                let dst = take(&mut rest, t * hd);
                pack_rows(src, off, rs, t, hd, dst);
                &*dst
            });
            // D_i = Σ_d dO_id O_id  (T)
            let d = take(&mut rest, t);
            for (i, di) in d.iter_mut().enumerate() {
                let off = l.o(b, h, i);
                *di = simd::sum_map2(&dy[off..off + hd], &o[off..off + hd], |a, b| a * b);
            }
            let grads = take(&mut rest, 3 * t * hd); // (3, T, hd): dq, dk, dv
            grads.fill(0.0);
            let tiles = Tiles { q_rows, k_rows, v_rows, g_rows, qt, dot, tp, d, lse };
            head_tiles(&tiles, l, spec, b, h, grads, rest);
            for (slot, part) in grads.chunks_exact(t * hd).enumerate() {
                for (i, row) in part.chunks_exact(hd).enumerate() {
                    // SAFETY: the q/k/v rows of head (b, h) are written only by this task.
                    unsafe { dx.write(l.qkv(b, h, i, slot), row) };
                }
            }
        }
    }
}

/// The packed per-head operands of the tile loop.
struct Tiles<'a> {
    q_rows: &'a [f32],
    k_rows: &'a [f32],
    v_rows: &'a [f32],
    g_rows: &'a [f32],
    qt: &'a [f32],
    dot: &'a [f32],
    /// Row stride of `qt`/`dot`.
    tp: usize,
    d: &'a [f32],
    lse: &'a [f32],
}

/// Accumulates dq, dk, dv `(3, T, hd)` of one head over all (key tile, query tile) pairs.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn head_tiles(p: &Tiles, l: &Layout, spec: &AttentionSpec, b: usize, h: usize, grads: &mut [f32], scratch: &mut [f32]) {
    let (t, hd, scale, tp) = (l.t, l.hd, spec.scale, p.tp);
    let (d, lse) = (p.d, p.lse);
    let mask = (spec.dropout_p > 0.0).then(|| DropoutMask::new(spec.dropout_seed, spec.dropout_p));
    let (dq, rest) = grads.split_at_mut(t * hd);
    let (dk, dv) = rest.split_at_mut(t * hd);
    let mut rest = scratch;
    let st = take(&mut rest, TILE * TILE); // P^T (kn, qn)
    let dpt = take(&mut rest, TILE * TILE); // dP^T, then dS^T (kn, qn)
    let pdt = take(&mut rest, TILE * TILE); // dropped P^T
    for ks in (0..t).step_by(TILE) {
        let kn = TILE.min(t - ks);
        let k = Strided { data: p.k_rows, off: ks * hd, rs: hd, cs: 1 };
        let v = Strided { data: p.v_rows, off: ks * hd, rs: hd, cs: 1 };
        // Causal: query tiles before this key tile see none of its keys.
        let q_first = if spec.causal { ks } else { 0 };
        for qs in (q_first..t).step_by(TILE) {
            let qn = TILE.min(t - qs);
            let (st, dpt) = (&mut st[..kn * qn], &mut dpt[..kn * qn]);
            matmul(kn, qn, hd, k, Strided { data: p.qt, off: qs, rs: tp, cs: 1 }, st, qn, scale, false);
            matmul(kn, qn, hd, v, Strided { data: p.dot, off: qs, rs: tp, cs: 1 }, dpt, qn, 1.0, false);
            if spec.causal {
                mask_causal(st, kn, qn, qn, ks, qs);
            }
            let (lse_t, d_t) = (&lse[qs..qs + qn], &d[qs..qs + qn]);
            for row in st.chunks_exact_mut(qn) {
                exp_sub(row, lse_t);
            }
            if let Some(mask) = &mask {
                // P_drop = P∘f feeds dV; dP = dP_drop∘f feeds dS.
                // The factors are hashed once into `pdt`, then applied to both tiles.
                let pdt = &mut pdt[..kn * qn];
                pdt.fill(1.0);
                apply_dropout(pdt, kn, qn, qn, mask, l, b, h, ks, qs);
                dpt.iter_mut().zip(pdt.iter()).for_each(|(g, &f)| *g *= f);
                pdt.iter_mut().zip(st.iter()).for_each(|(f, &pv)| *f *= pv);
            }
            for (prow, dsrow) in st.chunks_exact(qn).zip(dpt.chunks_exact_mut(qn)) {
                dsrow.iter_mut().zip(prow).zip(d_t).for_each(|((ds, &pv), &di)| *ds = pv * (*ds - di));
            }
            let pd = if mask.is_some() { &pdt[..kn * qn] } else { &st[..] };
            let g = Strided { data: p.g_rows, off: qs * hd, rs: hd, cs: 1 }; // dO rows (qn, hd)
            let q = Strided { data: p.q_rows, off: qs * hd, rs: hd, cs: 1 }; // Q rows (qn, hd)
            let dst = Strided { data: dpt, off: 0, rs: qn, cs: 1 }; // dS^T (kn, qn)
            let ds = Strided { data: dpt, off: 0, rs: 1, cs: qn }; // dS (qn, kn)
            matmul(kn, hd, qn, Strided { data: pd, off: 0, rs: qn, cs: 1 }, g, &mut dv[ks * hd..], hd, 1.0, true);
            matmul(kn, hd, qn, dst, q, &mut dk[ks * hd..], hd, scale, true);
            matmul(qn, hd, kn, ds, k, &mut dq[qs * hd..], hd, scale, true);
        }
    }
}
