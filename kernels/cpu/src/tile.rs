//! Register-blocked small matrix products for the attention tiles (≤ 64×64×head_dim).
//!
//! Every attention product has the form `C[m×n] (+)= α·Σ_p A(i,p)·B[p, 0..n]` where rows of B
//! are contiguous (a K/V/dO row, or a packed tile) and A is any strided matrix whose elements
//! are broadcast. Blocks of 4 rows × 64 columns keep 16 vector accumulators in registers
//! (AVX-512) across the whole `p` loop. [`matmul`] is its own [`crate::simd_kernel!`]: called,
//! not inlined, so the register allocation of its small loop nest does not depend on the
//! (large) caller; FMA via `mul_add` in the dispatched AVX2/AVX-512 copies.

use crate::simd_kernel;

/// A strided read-only operand: element `(r, c)` is `data[off + r*rs + c*cs]`.
#[derive(Clone, Copy)]
pub(crate) struct Strided<'a> {
    pub data: &'a [f32],
    pub off: usize,
    pub rs: usize,
    pub cs: usize,
}

/// `R` rows × `W` columns block starting at row `i`, column `j`.
///
/// # Safety
/// Every index read or written must be in bounds: [`matmul`] checks the extreme corners of
/// `A`, `B` and `C` once, so the hot loop carries no bounds checks.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn block<const R: usize, const W: usize>(
    k: usize,
    a: Strided,
    b: Strided,
    c: &mut [f32],
    c_rs: usize,
    i: usize,
    j: usize,
    alpha: f32,
    accumulate: bool,
) {
    let mut acc = [[0.0f32; W]; R];
    let (ap, bp) = (a.data.as_ptr().add(a.off + i * a.rs), b.data.as_ptr().add(b.off + j));
    for p in 0..k {
        let brow = &*(bp.add(p * b.rs) as *const [f32; W]);
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let av = *ap.add(r * a.rs + p * a.cs);
            for (x, &bv) in acc_r.iter_mut().zip(brow) {
                *x = av.mul_add(bv, *x);
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        let crow = &mut *(c.as_mut_ptr().add((i + r) * c_rs + j) as *mut [f32; W]);
        if accumulate {
            crow.iter_mut().zip(acc_r).for_each(|(c, &x)| *c += alpha * x);
        } else {
            crow.iter_mut().zip(acc_r).for_each(|(c, &x)| *c = alpha * x);
        }
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rows<const R: usize>(
    n: usize,
    k: usize,
    a: Strided,
    b: Strided,
    c: &mut [f32],
    c_rs: usize,
    i: usize,
    alpha: f32,
    accumulate: bool,
) {
    let mut j = 0;
    while j + 64 <= n {
        block::<R, 64>(k, a, b, c, c_rs, i, j, alpha, accumulate);
        j += 64;
    }
    while j + 16 <= n {
        block::<R, 16>(k, a, b, c, c_rs, i, j, alpha, accumulate);
        j += 16;
    }
    while j < n {
        block::<R, 1>(k, a, b, c, c_rs, i, j, alpha, accumulate);
        j += 1;
    }
}

simd_kernel! {
    /// `C[m×n] (row stride c_rs) = α·A·B` (or `+=` when `accumulate`), `B` with unit column
    /// stride (`b.cs` is ignored). The last element of each operand is checked against its slice
    /// up front (a failure is a bug in the caller's tile arithmetic, hence a panic).
    pub(crate) fn matmul(
        m: usize,
        n: usize,
        k: usize,
        a: Strided,
        b: Strided,
        c: &mut [f32],
        c_rs: usize,
        alpha: f32,
        accumulate: bool,
    ) {
        if m == 0 || n == 0 {
            return;
        }
        assert!((m - 1) * c_rs + n <= c.len(), "tile::matmul: C out of bounds");
        if k > 0 {
            assert!(a.off + (m - 1) * a.rs + (k - 1) * a.cs < a.data.len(), "tile::matmul: A out of bounds");
            assert!(b.off + (k - 1) * b.rs + n <= b.data.len(), "tile::matmul: B out of bounds");
        }
        // SAFETY: all indices are at most the corners checked above (strides are non-negative).
        unsafe {
            let mut i = 0;
            while i + 4 <= m {
                rows::<4>(n, k, a, b, c, c_rs, i, alpha, accumulate);
                i += 4;
            }
            while i < m {
                rows::<1>(n, k, a, b, c, c_rs, i, alpha, accumulate);
                i += 1;
            }
        }
    }
}

/// Copies the `rows × cols` block `src[off + r*rs + c]` transposed into `dst[c*dst_rs + r]`.
#[inline(always)]
pub(crate) fn transpose_into(
    src: &[f32],
    off: usize,
    rs: usize,
    rows: usize,
    cols: usize,
    dst: &mut [f32],
    dst_rs: usize,
) {
    for r in 0..rows {
        let row = &src[off + r * rs..off + r * rs + cols];
        for (c, &v) in row.iter().enumerate() {
            dst[c * dst_rs + r] = v;
        }
    }
}
