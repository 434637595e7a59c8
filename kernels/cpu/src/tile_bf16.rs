//! AVX512-BF16 (`vdpbf16ps`) tile products for the bf16 attention kernels, and the packing of
//! f32 tiles / bf16 rows into their pair layouts.
//!
//! `vdpbf16ps` multiplies 16 pairs of bf16 by 16 pairs and adds both exact products of each
//! lane into an f32 accumulator, so operands are stored as **pairs** along the reduction axis:
//! a `u32` whose low half is the element of even index and whose high half the next one
//! (the little-endian memory of two consecutive bf16). A bf16 row with the reduction along it
//! is therefore already a pair row; a reduction across rows interleaves two rows
//! ([`cols_to_pairs`], [`token_pairs`]).
//!
//! [`matmul_dp`] is the [`crate::tile::matmul`] of these operands: blocks of 4 rows × 64
//! columns keep 16 f32 accumulators in registers over the whole pair loop; one element of `A`
//! (a pair) is broadcast against contiguous pair rows of `B`. Products of two bf16 are exact in
//! f32, so the only roundings are the f32 additions (fixed order: pair index ascending) and the
//! caller's rounding of f32 tiles (probabilities, score gradients) into bf16 pairs.

use crate::widen::bf16_bits;

/// A read-only operand of bf16 pairs: pair `(r, p)` is `data[off + r*rs + p*cs]`.
#[derive(Clone, Copy)]
pub(crate) struct Pairs<'a> {
    pub data: &'a [u32],
    pub off: usize,
    pub rs: usize,
    pub cs: usize,
}

/// Two f32 rounded to bf16 (nearest even) as one pair: `lo` in the low half.
#[inline(always)]
pub(crate) fn pair(lo: f32, hi: f32) -> u32 {
    bf16_bits(lo) as u32 | (bf16_bits(hi) as u32) << 16
}

/// The `u16` halves of a pair buffer (pair `p` is halves `2p`, `2p+1`).
pub(crate) fn halves_mut(x: &mut [u32]) -> &mut [u16] {
    // SAFETY: u16 has a smaller alignment than u32, every bit pattern is valid for both, and
    // the new slice covers exactly the same bytes under the same exclusive borrow.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr() as *mut u16, x.len() * 2) }
}

/// Whether [`matmul_dp`] can run on this CPU.
pub(crate) fn supported() -> bool {
    crate::gemm_half::bf16_dot_supported()
}

/// `C[m×n] (row stride c_rs) = α·Σ_{p<kp} A(i,p)·B(p,j)` (or `+=` when `accumulate`), where
/// each term is the two-element dot product of a pair of `A` and a pair of `B`; `B(p, j)` is
/// `b.data[b.off + p*b.rs + j]` (`b.cs` is ignored). Corners are checked up front (a failure is
/// a bug in the caller's tile arithmetic, hence a panic), as is the CPU feature.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_dp(
    m: usize,
    n: usize,
    kp: usize,
    a: Pairs,
    b: Pairs,
    c: &mut [f32],
    c_rs: usize,
    alpha: f32,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!((m - 1) * c_rs + n <= c.len(), "tile_bf16::matmul_dp: C out of bounds");
    if kp > 0 {
        assert!(a.off + (m - 1) * a.rs + (kp - 1) * a.cs < a.data.len(), "tile_bf16::matmul_dp: A out of bounds");
        assert!(b.off + (kp - 1) * b.rs + n <= b.data.len(), "tile_bf16::matmul_dp: B out of bounds");
    }
    assert!(supported(), "tile_bf16::matmul_dp needs AVX512-BF16 (callers check `supported()`)");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the feature was checked above; every index is at most a corner checked above.
    unsafe {
        dp::matmul(m, n, kp, a, b, c, c_rs, alpha, accumulate)
    }
}

#[cfg(target_arch = "x86_64")]
mod dp {
    use super::Pairs;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn matmul(
        m: usize,
        n: usize,
        kp: usize,
        a: Pairs,
        b: Pairs,
        c: &mut [f32],
        c_rs: usize,
        alpha: f32,
        accumulate: bool,
    ) {
        let (ap, bp, cp) = (a.data.as_ptr().add(a.off), b.data.as_ptr().add(b.off), c.as_mut_ptr());
        let mut i = 0;
        while i + 4 <= m {
            cols::<4>(n, kp, ap.add(i * a.rs), a.rs, a.cs, bp, b.rs, cp.add(i * c_rs), c_rs, alpha, accumulate);
            i += 4;
        }
        while i < m {
            cols::<1>(n, kp, ap.add(i * a.rs), a.rs, a.cs, bp, b.rs, cp.add(i * c_rs), c_rs, alpha, accumulate);
            i += 1;
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn cols<const R: usize>(
        n: usize,
        kp: usize,
        a: *const u32,
        a_rs: usize,
        a_cs: usize,
        b: *const u32,
        b_rs: usize,
        c: *mut f32,
        c_rs: usize,
        alpha: f32,
        accumulate: bool,
    ) {
        let mut j = 0;
        while j + 64 <= n {
            block::<R, 4>(kp, a, a_rs, a_cs, b.add(j), b_rs, c.add(j), c_rs, alpha, accumulate, 0xffff);
            j += 64;
        }
        while j < n {
            let w = (n - j).min(16);
            let last = if w == 16 { 0xffff } else { (1u16 << w) - 1 };
            block::<R, 1>(kp, a, a_rs, a_cs, b.add(j), b_rs, c.add(j), c_rs, alpha, accumulate, last);
            j += 16;
        }
    }

    /// `R` rows × `V` vectors of 16 columns; `last` masks the columns of the last vector.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn block<const R: usize, const V: usize>(
        kp: usize,
        a: *const u32,
        a_rs: usize,
        a_cs: usize,
        b: *const u32,
        b_rs: usize,
        c: *mut f32,
        c_rs: usize,
        alpha: f32,
        accumulate: bool,
        last: u16,
    ) {
        let mask = |v: usize| if v + 1 == V { last } else { 0xffff };
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        for p in 0..kp {
            let brow = b.add(p * b_rs);
            let mut bv = [_mm512_setzero_si512(); V];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = _mm512_maskz_loadu_epi32(mask(v), brow.add(16 * v) as *const i32);
            }
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_epi32(*a.add(r * a_rs + p * a_cs) as i32);
                let av = std::mem::transmute::<__m512i, __m512bh>(av);
                for (x, &bvv) in acc_r.iter_mut().zip(&bv) {
                    *x = _mm512_dpbf16_ps(*x, av, std::mem::transmute::<__m512i, __m512bh>(bvv));
                }
            }
        }
        let al = _mm512_set1_ps(alpha);
        for (r, acc_r) in acc.iter().enumerate() {
            for (v, &x) in acc_r.iter().enumerate() {
                let cp = c.add(r * c_rs + 16 * v);
                let x = _mm512_mul_ps(al, x);
                let x = if accumulate { _mm512_add_ps(_mm512_maskz_loadu_ps(mask(v), cp), x) } else { x };
                _mm512_mask_storeu_ps(cp, mask(v), x);
            }
        }
    }
}

crate::simd_kernel! {
    /// Rows of an f32 tile (`rows` × `cols`, row stride `ld`) rounded into pairs along each
    /// row: `dst[r*kp + p] = pair(src[r][2p], src[r][2p+1])`, `kp = cols.div_ceil(2)`, the
    /// missing half of an odd last pair 0.
    pub(crate) fn rows_to_pairs(src: &[f32], ld: usize, rows: usize, cols: usize, dst: &mut [u32]) {
        let kp = cols.div_ceil(2);
        let halves = halves_mut(&mut dst[..rows * kp]);
        for (r, d) in halves.chunks_exact_mut(2 * kp).enumerate() {
            let s = &src[r * ld..r * ld + cols];
            d.iter_mut().zip(s).for_each(|(d, &x)| *d = bf16_bits(x));
            d[cols..].fill(0);
        }
    }
}

crate::simd_kernel! {
    /// Columns of an f32 tile (`rows` × `cols`, row stride `ld`) rounded into pairs across
    /// rows: `dst[p*cols + c] = pair(src[2p][c], src[2p+1][c])`, the missing row of an odd
    /// last pair 0.
    pub(crate) fn cols_to_pairs(src: &[f32], ld: usize, rows: usize, cols: usize, dst: &mut [u32]) {
        for (p, d) in dst.chunks_exact_mut(cols).take(rows.div_ceil(2)).enumerate() {
            let lo = &src[2 * p * ld..2 * p * ld + cols];
            if 2 * p + 1 < rows {
                let hi = &src[(2 * p + 1) * ld..(2 * p + 1) * ld + cols];
                d.iter_mut().zip(lo).zip(hi).for_each(|((d, &l), &h)| *d = pair(l, h));
            } else {
                d.iter_mut().zip(lo).for_each(|(d, &l)| *d = bf16_bits(l) as u32);
            }
        }
    }
}

crate::simd_kernel! {
    /// bf16 rows `src[off + r*rs ..][..cols]` (`r < rows`) interleaved two by two into pairs
    /// across rows: `dst[p*cols + c] = src(2p, c) | src(2p+1, c) << 16` (0 for a missing row).
    pub(crate) fn token_pairs(src: &[u16], off: usize, rs: usize, rows: usize, cols: usize, dst: &mut [u32]) {
        for (p, d) in dst.chunks_exact_mut(cols).take(rows.div_ceil(2)).enumerate() {
            let lo = &src[off + 2 * p * rs..off + 2 * p * rs + cols];
            if 2 * p + 1 < rows {
                let hi = &src[off + (2 * p + 1) * rs..off + (2 * p + 1) * rs + cols];
                d.iter_mut().zip(lo).zip(hi).for_each(|((d, &l), &h)| *d = l as u32 | (h as u32) << 16);
            } else {
                d.iter_mut().zip(lo).for_each(|(d, &l)| *d = l as u32);
            }
        }
    }
}

/// bf16 rows `src[off + r*rs ..][..cols]` copied as pair rows: `dst[r*kp + p]` holds elements
/// `2p, 2p+1` of row `r` (`kp = cols.div_ceil(2)`, the missing half 0).
pub(crate) fn row_pairs(src: &[u16], off: usize, rs: usize, rows: usize, cols: usize, dst: &mut [u32]) {
    let kp = cols.div_ceil(2);
    let halves = halves_mut(&mut dst[..rows * kp]);
    for (r, d) in halves.chunks_exact_mut(2 * kp).enumerate() {
        d[..cols].copy_from_slice(&src[off + r * rs..off + r * rs + cols]);
        d[cols..].fill(0);
    }
}

/// bf16 rows transposed into pair rows: `dst[p*ld + r]` holds elements `2p, 2p+1` of row `r`
/// (`p < cols.div_ceil(2)`, the missing half 0): a `B` operand whose columns are the rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pairs_transposed(
    src: &[u16],
    off: usize,
    rs: usize,
    rows: usize,
    cols: usize,
    dst: &mut [u32],
    ld: usize,
) {
    for r in 0..rows {
        let row = &src[off + r * rs..off + r * rs + cols];
        for (p, two) in row.chunks(2).enumerate() {
            dst[p * ld + r] = two[0] as u32 | (*two.get(1).unwrap_or(&0) as u32) << 16;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn widen(bits: u16) -> f64 {
        f32::from_bits((bits as u32) << 16) as f64
    }

    /// `matmul_dp` against an f64 loop over the same bf16 pairs, every tail of the 4-row /
    /// 64-column / 16-column blocking, strided `A`, `accumulate` on and off. Products of bf16
    /// are exact, so the only error is f32 summation: bounded by `2·kp·2^-24·Σ|terms|`,
    /// checked as `1e-6·(kp+1)·max|term sum|`.
    #[test]
    fn matmul_dp_matches_f64_reference() {
        if !supported() {
            eprintln!("SKIP matmul_dp_matches_f64_reference: this CPU has no AVX512-BF16");
            return;
        }
        let mut seed = 5u64;
        for &(m, n, kp) in &[(1, 1, 1), (4, 64, 32), (7, 70, 33), (64, 64, 32), (5, 17, 3), (9, 130, 1), (3, 5, 0)] {
            for (a_rs, a_cs) in [(kp.max(1), 1), (1, m)] {
                let a: Vec<u32> = (0..m * kp.max(1)).map(|_| pair(lcg(&mut seed), lcg(&mut seed))).collect();
                let b: Vec<u32> = (0..kp.max(1) * n).map(|_| pair(lcg(&mut seed), lcg(&mut seed))).collect();
                for accumulate in [false, true] {
                    let c_rs = n + 3;
                    let c0: Vec<f32> = (0..m * c_rs).map(|_| lcg(&mut seed)).collect();
                    let mut c = c0.clone();
                    let (ap, bp) =
                        (Pairs { data: &a, off: 0, rs: a_rs, cs: a_cs }, Pairs { data: &b, off: 0, rs: n, cs: 1 });
                    matmul_dp(m, n, kp, ap, bp, &mut c, c_rs, 0.5, accumulate);
                    for i in 0..m {
                        for j in 0..n {
                            let (mut s, mut sa) = (0.0f64, 0.0f64);
                            for p in 0..kp {
                                let (x, y) = (a[i * a_rs + p * a_cs], b[p * n + j]);
                                for h in [0, 16] {
                                    let t = widen((x >> h) as u16) * widen((y >> h) as u16);
                                    s += t;
                                    sa += t.abs();
                                }
                            }
                            let want = 0.5 * s + if accumulate { c0[i * c_rs + j] as f64 } else { 0.0 };
                            let got = c[i * c_rs + j] as f64;
                            let tol = 1e-6 * (kp as f64 + 1.0) * (sa + 1.0);
                            assert!((got - want).abs() <= tol, "({m},{n},{kp}) [{i},{j}]: {got} vs {want}");
                        }
                    }
                    // Columns past n are untouched.
                    for i in 0..m {
                        assert_eq!(&c[i * c_rs + n..(i + 1) * c_rs], &c0[i * c_rs + n..(i + 1) * c_rs]);
                    }
                }
            }
        }
    }

    /// The pair packers against their definitions (odd rows / columns pad with 0).
    #[test]
    fn pair_packers_match_definitions() {
        let mut seed = 9u64;
        let (rows, cols, ld) = (5, 7, 9);
        let src: Vec<f32> = (0..rows * ld).map(|_| lcg(&mut seed)).collect();
        let at = |r: usize, c: usize| if r < rows && c < cols { bf16_bits(src[r * ld + c]) } else { 0 };
        let mut d = vec![7u32; 64];
        rows_to_pairs(&src, ld, rows, cols, &mut d);
        for r in 0..rows {
            for p in 0..4 {
                assert_eq!(d[r * 4 + p], at(r, 2 * p) as u32 | (at(r, 2 * p + 1) as u32) << 16);
            }
        }
        cols_to_pairs(&src, ld, rows, cols, &mut d);
        for p in 0..3 {
            for c in 0..cols {
                assert_eq!(d[p * cols + c], at(2 * p, c) as u32 | (at(2 * p + 1, c) as u32) << 16);
            }
        }
        let bits: Vec<u16> = src.iter().map(|&x| bf16_bits(x)).collect();
        let bat = |r: usize, c: usize| if r < rows && c < cols { bits[r * ld + c] as u32 } else { 0 };
        token_pairs(&bits, 0, ld, rows, cols, &mut d);
        for p in 0..3 {
            for c in 0..cols {
                assert_eq!(d[p * cols + c], bat(2 * p, c) | bat(2 * p + 1, c) << 16);
            }
        }
        row_pairs(&bits, 0, ld, rows, cols, &mut d);
        for r in 0..rows {
            for p in 0..4 {
                assert_eq!(d[r * 4 + p], bat(r, 2 * p) | bat(r, 2 * p + 1) << 16);
            }
        }
        pairs_transposed(&bits, 0, ld, rows, cols, &mut d, 6);
        for p in 0..4 {
            for r in 0..rows {
                assert_eq!(d[p * 6 + r], bat(r, 2 * p) | bat(r, 2 * p + 1) << 16);
            }
        }
    }
}
