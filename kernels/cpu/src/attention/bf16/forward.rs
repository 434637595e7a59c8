//! bf16 attention forward, one (batch, head) per call: `S = scale·Q·Kᵀ` and `acc += P·V` on
//! `vdpbf16ps` tiles, online softmax over key tiles in fp32 on row-major score tiles.

use super::super::{Layout, TILE};
use super::store_row;
use crate::expvec::exp_sub_sum;
use crate::rng::DropoutMask;
use crate::scratch::{take, take_u32, RowWriter, Scratch};
use crate::simd;
use crate::simd_kernel;
use crate::tile_bf16::{matmul_dp, pairs_transposed, row_pairs, rows_to_pairs, token_pairs, Pairs};
use megatron_core::AttentionSpec;

/// Row stride of the f32 score tile (padded so rows do not alias 4 KiB apart).
pub(super) const LD: usize = TILE + 16;

simd_kernel! {
    /// All query tiles of one (b, h): writes its bf16 output rows through `out` and its `lse` `(T)`.
    pub(super) fn forward_head(
        x: &[u16],
        l: &Layout,
        spec: &AttentionSpec,
        b: usize,
        h: usize,
        out: &RowWriter<u16>,
        lse: &mut [f32],
    ) {
        let (t, hd) = (l.t, l.hd);
        let hp = hd.div_ceil(2);
        // Row stride of the Kᵀ pair columns: padded against 4 KiB aliasing.
        let tk = t.next_multiple_of(16) + 16;
        let n = t * hp + hp * tk + t.div_ceil(2) * hd + TILE * hd + TILE * LD + TILE * TILE / 2 + 2 * TILE;
        let mut scratch = Scratch::get(n);
        let mut rest = scratch.as_mut();
        let q = take_u32(&mut rest, t * hp); // (T, hd/2) pair rows
        row_pairs(x, l.qkv(b, h, 0, 0), l.rs, t, hd, q);
        let kt = take_u32(&mut rest, hp * tk); // (hd/2, T) pair columns
        pairs_transposed(x, l.qkv(b, h, 0, 1), l.rs, t, hd, kt, tk);
        let v = take_u32(&mut rest, t.div_ceil(2) * hd); // (T/2, hd) token pairs
        token_pairs(x, l.qkv(b, h, 0, 2), l.rs, t, hd, v);
        let ops = Ops { q, kt, tk, v };
        let acc = take(&mut rest, TILE * hd);
        for qs in (0..t).step_by(TILE) {
            let qn = TILE.min(t - qs);
            let acc = &mut acc[..qn * hd];
            forward_tile(&ops, l, spec, b, h, qs, acc, &mut lse[qs..qs + qn], &mut *rest);
            for (r, row) in acc.chunks_exact(hd).enumerate() {
                // SAFETY: rows of head (b, h) are written only by this task.
                store_row(row, unsafe { out.row_mut(l.o(b, h, qs + r), hd) });
            }
        }
    }
}

/// The packed operands of one head.
struct Ops<'a> {
    q: &'a [u32],
    kt: &'a [u32],
    tk: usize,
    v: &'a [u32],
}

/// One query tile `[qs, qs+qn)`: its normalised output rows `acc (qn, hd)` and `lse (qn)`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn forward_tile(
    p: &Ops,
    l: &Layout,
    spec: &AttentionSpec,
    b: usize,
    h: usize,
    qs: usize,
    acc: &mut [f32],
    lse: &mut [f32],
    scratch: &mut [f32],
) {
    let (hd, hp, qn) = (l.hd, l.hd.div_ceil(2), lse.len());
    let kend = if spec.causal { qs + qn } else { l.t };
    let mask = (spec.dropout_p > 0.0).then(|| DropoutMask::new(spec.dropout_seed, spec.dropout_p));
    let mut rest = scratch;
    let s = take(&mut rest, TILE * LD); // (qn, kn) scores, then probabilities
    let pp = take_u32(&mut rest, TILE * TILE / 2); // (qn, kn/2) bf16 probability pairs
    let m = take(&mut rest, qn); // running max per query
    let sum = take(&mut rest, qn); // running Σ exp(s − m) per query
    m.fill(f32::NEG_INFINITY);
    sum.fill(0.0);
    acc.fill(0.0);
    let qa = Pairs { data: p.q, off: qs * hp, rs: hp, cs: 1 };
    for ks in (0..kend).step_by(TILE) {
        let kn = TILE.min(kend - ks);
        let kp = kn.div_ceil(2);
        matmul_dp(qn, kn, hp, qa, Pairs { data: p.kt, off: ks, rs: p.tk, cs: 1 }, s, LD, spec.scale, false);
        for r in 0..qn {
            let row = &mut s[r * LD..r * LD + kn];
            if spec.causal {
                // Keys after query qs+r are hidden (the first key tile always shows key 0).
                row[(qs + r + 1).saturating_sub(ks).min(kn)..].fill(f32::NEG_INFINITY);
            }
            let m_new = m[r].max(simd::max(row));
            let corr = simd::exp(m[r] - m_new);
            sum[r] = sum[r] * corr + exp_sub_sum(row, m_new);
            m[r] = m_new;
            acc[r * hd..(r + 1) * hd].iter_mut().for_each(|a| *a *= corr);
            if let Some(mask) = &mask {
                for (c, v) in row.iter_mut().enumerate() {
                    *v *= mask.factor(l.mask_index(b, h, qs + r, ks + c));
                }
            }
        }
        rows_to_pairs(s, LD, qn, kn, pp);
        let pa = Pairs { data: pp, off: 0, rs: kp, cs: 1 };
        matmul_dp(qn, hd, kp, pa, Pairs { data: p.v, off: ks / 2 * hd, rs: hd, cs: 1 }, acc, hd, 1.0, true);
    }
    for ((z, &mx), &sm) in lse.iter_mut().zip(m.iter()).zip(sum.iter()) {
        *z = mx + sm.ln();
    }
    for (row, &sm) in acc.chunks_exact_mut(hd).zip(sum.iter()) {
        let inv = 1.0 / sm;
        row.iter_mut().for_each(|a| *a *= inv);
    }
}
