//! Cross-attention forward, one (batch, head) per call: the valid K and V rows packed
//! contiguous, then query tiles of [`TILE`] rows with an online softmax over key tiles
//! (scores kept transposed, `S^T (keys, queries)`, as in the self-attention kernel).

use super::{Head, TILE};
use crate::attention::mask_causal;
use crate::expvec::online_softmax_tile;
use crate::rng::DropoutMask;
use crate::scratch::{take, RowWriter, Scratch};
use crate::simd_kernel;
use crate::tile::{matmul, transpose_into, Strided};

/// Rows `[0, rows)` of a strided matrix copied contiguous (`dst (rows, cols)`).
pub(super) fn pack_rows(src: &[f32], off: usize, rs: usize, rows: usize, cols: usize, dst: &mut [f32]) {
    for (r, d) in dst.chunks_exact_mut(cols).take(rows).enumerate() {
        d.copy_from_slice(&src[off + r * rs..off + r * rs + cols]);
    }
}

simd_kernel! {
    /// All query tiles of one (b, h): writes its `Tq` output rows into `out` (zero rows for
    /// padded queries or queries without keys) and its `lse` `(Tq)` (0 for those).
    pub(super) fn forward_head(q: &[f32], kv: &[f32], p: &Head, out: &RowWriter, lse: &mut [f32]) {
        let (l, hd) = (p.l, p.l.hd);
        let (qv, kvn) = if p.kvn == 0 { (0, 0) } else { (p.qv, p.kvn) };
        let ld = TILE + 32;
        let mut scratch = Scratch::get(2 * kvn * hd + 2 * TILE * hd + TILE * ld + 3 * TILE);
        {
            let mut rest = scratch.as_mut();
            let k = take(&mut rest, kvn * hd); // (kvn, hd)
            let v = take(&mut rest, kvn * hd); // (kvn, hd)
            pack_rows(kv, l.kv(p.b, 0, p.h, 0), l.rs_kv, kvn, hd, k);
            pack_rows(kv, l.kv(p.b, 0, p.h, 1), l.rs_kv, kvn, hd, v);
            for qs in (0..qv).step_by(TILE) {
                let qn = TILE.min(qv - qs);
                let mut tile_buf = &mut rest[..];
                let acc = take(&mut tile_buf, qn * hd);
                forward_tile(q, k, v, p, qs, acc, &mut lse[qs..qs + qn], tile_buf);
                for (r, row) in acc.chunks_exact(hd).enumerate() {
                    // SAFETY: rows of head (b, h) are written only by this task.
                    unsafe { out.write(l.q(p.b, qs + r, p.h), row) };
                }
            }
            let zero = &mut rest[..hd];
            zero.fill(0.0);
            for (i, z) in lse.iter_mut().enumerate().skip(qv) {
                // SAFETY: as above.
                unsafe { out.write(l.q(p.b, i, p.h), zero) };
                *z = 0.0;
            }
        }
    }
}

/// One query tile `[qs, qs+qn)` of valid queries: writes its output rows `(qn, hd)` and `lse`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn forward_tile(
    q: &[f32],
    k_rows: &[f32],
    v_rows: &[f32],
    p: &Head,
    qs: usize,
    acc: &mut [f32],
    lse: &mut [f32],
    scratch: &mut [f32],
) {
    let (l, spec) = (p.l, p.spec);
    let (hd, qn) = (l.hd, lse.len());
    // Causal: queries of this tile see keys up to their own position.
    let kend = if spec.causal { p.kvn.min(qs + qn) } else { p.kvn };
    let mask = (spec.dropout_p > 0.0).then(|| DropoutMask::new(spec.dropout_seed, spec.dropout_p));
    let mut rest = scratch;
    let qt = take(&mut rest, hd * qn); // (hd, qn) Q^T of this tile
    transpose_into(q, l.q(p.b, qs, p.h), l.rs_q, qn, hd, qt, qn);
    let qt = Strided { data: qt, off: 0, rs: qn, cs: 1 };
    acc.fill(0.0); // (qn, hd) unnormalised output
    let m = take(&mut rest, qn); // running max per query
    m.fill(f32::NEG_INFINITY);
    let sum = take(&mut rest, qn); // running Σ exp(s − m) per query
    sum.fill(0.0);
    let corr = take(&mut rest, qn); // e^{m_old − m_new} per query
    let ld = qn.next_multiple_of(16) + 16;
    let st = take(&mut rest, TILE * ld); // (kn, qn) scores^T, then probabilities^T
    for ks in (0..kend).step_by(TILE) {
        let kn = TILE.min(kend - ks);
        let st = &mut st[..kn * ld];
        let k = Strided { data: k_rows, off: ks * hd, rs: hd, cs: 1 };
        matmul(kn, qn, hd, k, qt, st, ld, spec.scale, false);
        p.add_bias(st, kn, qn, ld, ks, qs);
        if spec.causal {
            mask_causal(st, kn, qn, ld, ks, qs);
        }
        // The first key tile holds key 0, visible to every valid query: the max is finite.
        online_softmax_tile(st, kn, ld, m, sum, corr);
        for (a, &c) in acc.chunks_exact_mut(hd).zip(corr.iter()) {
            a.iter_mut().for_each(|v| *v *= c);
        }
        if let Some(mask) = &mask {
            p.dropout(st, kn, qn, ld, mask, ks, qs);
        }
        let pm = Strided { data: st, off: 0, rs: 1, cs: ld }; // P (qn, kn) read from P^T
        let v = Strided { data: v_rows, off: ks * hd, rs: hd, cs: 1 };
        matmul(qn, hd, kn, pm, v, acc, hd, 1.0, true);
    }
    for ((z, &mx), &s) in lse.iter_mut().zip(m.iter()).zip(sum.iter()) {
        *z = mx + s.ln();
    }
    for (row, &s) in acc.chunks_exact_mut(hd).zip(sum.iter()) {
        let inv = 1.0 / s;
        row.iter_mut().for_each(|a| *a *= inv);
    }
}
