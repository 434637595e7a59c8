//! Cross-attention backward, one (batch, head) per call: score tiles recomputed from the
//! packed q/k, the bias and `lse`, with key tiles outer (dK, dV accumulate in place) and
//! query tiles inner; the unscaled `dS` tiles are also added into the head's `d_bias`.

use super::forward::pack_rows;
use super::{Head, TILE};
use crate::attention::mask_causal;
use crate::expvec::exp_sub;
use crate::rng::DropoutMask;
use crate::scratch::{take, RowWriter, Scratch};
use crate::simd;
use crate::simd_kernel;
use crate::tile::{matmul, transpose_into, Strided};

/// The whole tensors every head task reads.
pub(super) struct Operands<'a> {
    pub q: &'a [f32],
    pub kv: &'a [f32],
    pub o: &'a [f32],
    pub dy: &'a [f32],
    pub lse: &'a [f32],
}

simd_kernel! {
    /// Gradients of one (b, h): writes its rows of `d_q` and `d_kv` (zeros for padding) and
    /// adds its `dS` into `d_bias` `(Tq, Tk)` of head `h` when given.
    pub(super) fn backward_head(x: &Operands, p: &Head, dq_w: &RowWriter, dkv_w: &RowWriter, d_bias: Option<&mut [f32]>) {
        let (l, hd) = (p.l, p.l.hd);
        let (qv, kvn) = if p.kvn == 0 { (0, 0) } else { (p.qv, p.kvn) };
        let tp = qv.next_multiple_of(16) + 16;
        let mut scratch = Scratch::get(2 * hd * tp + 3 * qv * hd + 4 * kvn * hd + qv + 3 * TILE * TILE + hd);
        {
            let mut rest = scratch.as_mut();
            let (qt, dot) = (take(&mut rest, hd * tp), take(&mut rest, hd * tp));
            transpose_into(x.q, l.q(p.b, 0, p.h), l.rs_q, qv, hd, qt, tp);
            transpose_into(x.dy, l.q(p.b, 0, p.h), l.rs_q, qv, hd, dot, tp);
            let (q_rows, g_rows) = (take(&mut rest, qv * hd), take(&mut rest, qv * hd));
            pack_rows(x.q, l.q(p.b, 0, p.h), l.rs_q, qv, hd, q_rows);
            pack_rows(x.dy, l.q(p.b, 0, p.h), l.rs_q, qv, hd, g_rows);
            let (k_rows, v_rows) = (take(&mut rest, kvn * hd), take(&mut rest, kvn * hd));
            pack_rows(x.kv, l.kv(p.b, 0, p.h, 0), l.rs_kv, kvn, hd, k_rows);
            pack_rows(x.kv, l.kv(p.b, 0, p.h, 1), l.rs_kv, kvn, hd, v_rows);
            // D_i = Σ_d dO_id O_id  (qv)
            let d = take(&mut rest, qv);
            for (i, di) in d.iter_mut().enumerate() {
                let off = l.q(p.b, i, p.h);
                *di = simd::sum_map2(&x.dy[off..off + hd], &x.o[off..off + hd], |a, b| a * b);
            }
            let dq = take(&mut rest, qv * hd);
            let dk = take(&mut rest, kvn * hd);
            let dv = take(&mut rest, kvn * hd);
            dq.fill(0.0);
            dk.fill(0.0);
            dv.fill(0.0);
            let lse_off = (p.b * l.heads + p.h) * l.tq;
            let t = Tiles { q_rows, k_rows, v_rows, g_rows, qt, dot, tp, d, lse: &x.lse[lse_off..lse_off + l.tq] };
            let zero = take(&mut rest, hd);
            zero.fill(0.0);
            head_tiles(&t, p, qv, kvn, dq, dk, dv, d_bias, rest);
            for i in 0..l.tq {
                let row = if i < qv { &dq[i * hd..(i + 1) * hd] } else { &*zero };
                // SAFETY: the rows of head (b, h) are written only by this task.
                unsafe { dq_w.write(l.q(p.b, i, p.h), row) };
            }
            for j in 0..l.tk {
                let (kr, vr) = if j < kvn { (&dk[j * hd..(j + 1) * hd], &dv[j * hd..(j + 1) * hd]) } else { (&*zero, &*zero) };
                // SAFETY: as above.
                unsafe {
                    dkv_w.write(l.kv(p.b, j, p.h, 0), kr);
                    dkv_w.write(l.kv(p.b, j, p.h, 1), vr);
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

/// Accumulates dq `(qv, hd)`, dk, dv `(kvn, hd)` of one head over all (key tile, query tile) pairs.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn head_tiles(
    t: &Tiles,
    p: &Head,
    qv: usize,
    kvn: usize,
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
    mut d_bias: Option<&mut [f32]>,
    scratch: &mut [f32],
) {
    let (spec, hd, tk, tp) = (p.spec, p.l.hd, p.l.tk, t.tp);
    let scale = spec.scale;
    let mask = (spec.dropout_p > 0.0).then(|| DropoutMask::new(spec.dropout_seed, spec.dropout_p));
    let mut rest = scratch;
    let st = take(&mut rest, TILE * TILE); // P^T (kn, qn)
    let dpt = take(&mut rest, TILE * TILE); // dP^T, then dS^T (kn, qn)
    let pdt = take(&mut rest, TILE * TILE); // dropped P^T
    for ks in (0..kvn).step_by(TILE) {
        let kn = TILE.min(kvn - ks);
        let k = Strided { data: t.k_rows, off: ks * hd, rs: hd, cs: 1 };
        let v = Strided { data: t.v_rows, off: ks * hd, rs: hd, cs: 1 };
        // Causal: query tiles before this key tile see none of its keys.
        let q_first = if spec.causal { ks } else { 0 };
        for qs in (q_first..qv).step_by(TILE) {
            let qn = TILE.min(qv - qs);
            let (st, dpt) = (&mut st[..kn * qn], &mut dpt[..kn * qn]);
            matmul(kn, qn, hd, k, Strided { data: t.qt, off: qs, rs: tp, cs: 1 }, st, qn, scale, false);
            matmul(kn, qn, hd, v, Strided { data: t.dot, off: qs, rs: tp, cs: 1 }, dpt, qn, 1.0, false);
            p.add_bias(st, kn, qn, qn, ks, qs);
            if spec.causal {
                mask_causal(st, kn, qn, qn, ks, qs);
            }
            let (lse_t, d_t) = (&t.lse[qs..qs + qn], &t.d[qs..qs + qn]);
            for row in st.chunks_exact_mut(qn) {
                exp_sub(row, lse_t);
            }
            if let Some(mask) = &mask {
                // P_drop = P∘f feeds dV; dP = dP_drop∘f feeds dS.
                let pdt = &mut pdt[..kn * qn];
                pdt.fill(1.0);
                p.dropout(pdt, kn, qn, qn, mask, ks, qs);
                dpt.iter_mut().zip(pdt.iter()).for_each(|(g, &f)| *g *= f);
                pdt.iter_mut().zip(st.iter()).for_each(|(f, &pv)| *f *= pv);
            }
            for (prow, dsrow) in st.chunks_exact(qn).zip(dpt.chunks_exact_mut(qn)) {
                dsrow.iter_mut().zip(prow).zip(d_t).for_each(|((ds, &pv), &di)| *ds = pv * (*ds - di));
            }
            if let Some(db) = d_bias.as_deref_mut() {
                // The bias enters the scores unscaled: d_bias = dS.
                for (c, dsrow) in dpt.chunks_exact(qn).enumerate() {
                    for (r, &ds) in dsrow.iter().enumerate() {
                        db[(qs + r) * tk + ks + c] += ds;
                    }
                }
            }
            let pd = if mask.is_some() { &pdt[..kn * qn] } else { &st[..] };
            let g = Strided { data: t.g_rows, off: qs * hd, rs: hd, cs: 1 }; // dO rows (qn, hd)
            let qr = Strided { data: t.q_rows, off: qs * hd, rs: hd, cs: 1 }; // Q rows (qn, hd)
            let dst = Strided { data: dpt, off: 0, rs: qn, cs: 1 }; // dS^T (kn, qn)
            let ds = Strided { data: dpt, off: 0, rs: 1, cs: qn }; // dS (qn, kn)
            matmul(kn, hd, qn, Strided { data: pd, off: 0, rs: qn, cs: 1 }, g, &mut dv[ks * hd..], hd, 1.0, true);
            matmul(kn, hd, qn, dst, qr, &mut dk[ks * hd..], hd, scale, true);
            matmul(qn, hd, kn, ds, k, &mut dq[qs * hd..], hd, scale, true);
        }
    }
}
