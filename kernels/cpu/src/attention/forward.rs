//! Attention forward, one (batch, head) per call: K and V packed contiguous, then query tiles
//! of [`TILE`] rows with an online softmax over key tiles (scores kept transposed).

use super::{apply_dropout, mask_causal, Layout, TILE};
use crate::expvec::online_softmax_tile;
use crate::rng::DropoutMask;
use crate::scratch::{take, RowWriter, Scratch};
use crate::simd_kernel;
use crate::tile::{matmul, transpose_into, Strided};
use megatron_core::AttentionSpec;

/// Rows `[0, rows)` of a strided matrix (`src[off + r*rs + c]`, `c < cols`) copied contiguous,
/// so tile products stream them without the cache-set conflicts of the fused-QKV row stride.
pub(super) fn pack_rows(src: &[f32], off: usize, rs: usize, rows: usize, cols: usize, dst: &mut [f32]) {
    for (r, d) in dst.chunks_exact_mut(cols).take(rows).enumerate() {
        d.copy_from_slice(&src[off + r * rs..off + r * rs + cols]);
    }
}

simd_kernel! {
    /// All query tiles of one (b, h): writes its output rows into `out` and its `lse` `(T)`.
    pub(super) fn forward_head(
        x: &[f32],
        l: &Layout,
        spec: &AttentionSpec,
        b: usize,
        h: usize,
        out: &RowWriter,
        lse: &mut [f32],
    ) {
        let (t, hd) = (l.t, l.hd);
        let mut scratch = Scratch::get(2 * t * hd + 3 * TILE * (TILE + 32) + 4 * TILE);
        {
            let mut rest = scratch.as_mut();
            let k = take(&mut rest, t * hd); // (T, hd)
            let v = take(&mut rest, t * hd); // (T, hd)
            pack_rows(x, l.qkv(b, h, 0, 1), l.rs, t, hd, k);
            pack_rows(x, l.qkv(b, h, 0, 2), l.rs, t, hd, v);
            for qs in (0..t).step_by(TILE) {
                let qn = TILE.min(t - qs);
                let mut tile_buf = &mut rest[..];
                let acc = take(&mut tile_buf, qn * hd);
                forward_tile(x, k, v, l, spec, b, h, qs, acc, &mut lse[qs..qs + qn], tile_buf);
                for (r, row) in acc.chunks_exact(hd).enumerate() {
                    // SAFETY: rows of head (b, h) are written only by this task.
                    unsafe { out.write(l.o(b, h, qs + r), row) };
                }
            }
        }
    }
}

/// One query tile `[qs, qs+qn)`: writes its output rows `(qn, hd)` and `lse` `(qn)`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn forward_tile(
    x: &[f32],
    k_rows: &[f32],
    v_rows: &[f32],
    l: &Layout,
    spec: &AttentionSpec,
    b: usize,
    h: usize,
    qs: usize,
    acc: &mut [f32],
    lse: &mut [f32],
    scratch: &mut [f32],
) {
    let (hd, qn) = (l.hd, lse.len());
    let kend = if spec.causal { qs + qn } else { l.t };
    let mask = (spec.dropout_p > 0.0).then(|| DropoutMask::new(spec.dropout_seed, spec.dropout_p));
    let mut rest = scratch;
    let qt = take(&mut rest, hd * qn); // (hd, qn) Q^T of this tile
    transpose_into(x, l.qkv(b, h, qs, 0), l.rs, qn, hd, qt, qn);
    let qt = Strided { data: qt, off: 0, rs: qn, cs: 1 };
    acc.fill(0.0); // (qn, hd) unnormalised output
    let m = take(&mut rest, qn); // running max per query
    m.fill(f32::NEG_INFINITY);
    let sum = take(&mut rest, qn); // running Σ exp(s − m) per query
    sum.fill(0.0);
    // e^{m_old − m_new} per query
    let corr = take(&mut rest, qn);
    // (kn, qn) scores^T, then probabilities^T; the padded row stride `ld` keeps rows 16 apart
    // from sharing 4 KiB-aliased addresses.
    let ld = qn.next_multiple_of(16) + 16;
    let st = take(&mut rest, TILE * ld);
    for ks in (0..kend).step_by(TILE) {
        let kn = TILE.min(kend - ks);
        let st = &mut st[..kn * ld];
        let k = Strided { data: k_rows, off: ks * hd, rs: hd, cs: 1 };
        matmul(kn, qn, hd, k, qt, st, ld, spec.scale, false);
        if spec.causal {
            mask_causal(st, kn, qn, ld, ks, qs);
        }
        // The first key tile always holds key 0, visible to every query, so the max is finite.
        online_softmax_tile(st, kn, ld, m, sum, corr);
        for (a, &c) in acc.chunks_exact_mut(hd).zip(corr.iter()) {
            a.iter_mut().for_each(|v| *v *= c);
        }
        if let Some(mask) = &mask {
            apply_dropout(st, kn, qn, ld, mask, l, b, h, ks, qs);
        }
        let p = Strided { data: st, off: 0, rs: 1, cs: ld }; // P (qn, kn) read from P^T
        let v = Strided { data: v_rows, off: ks * hd, rs: hd, cs: 1 };
        matmul(qn, hd, kn, p, v, acc, hd, 1.0, true);
    }
    for ((z, &mx), &s) in lse.iter_mut().zip(m.iter()).zip(sum.iter()) {
        *z = mx + s.ln();
    }
    for (row, &s) in acc.chunks_exact_mut(hd).zip(sum.iter()) {
        let inv = 1.0 / s;
        row.iter_mut().for_each(|a| *a *= inv);
    }
}
