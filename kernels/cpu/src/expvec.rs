//! Vectorised `exp` over slices for the hottest loops (attention softmax tiles, the
//! cross-entropy passes over a 50k-wide vocab).
//!
//! On AVX-512 it is written with intrinsics: `n = round(x·log2 e)`, `r = x − n·ln 2`
//! (Cody–Waite, two FMAs), a degree-6 Taylor polynomial for `e^r` on `|r| ≤ ln2/2` (relative
//! error ≤ 1.2e-7) and `vscalefps` for `·2^n`: 14 vector ops per 16 values, against ~19 for
//! the portable [`crate::simd::exp`] that other CPUs use. Inputs are clamped to `[-87, 88]`
//! and anything below −87 (including `−∞`) gives exactly 0, so no denormal is ever produced.

use crate::simd::{self, level, Level};

/// `x[i] = exp(x[i] − sub[i])` (`sub` as long as `x`).
#[inline(always)]
pub(crate) fn exp_sub(x: &mut [f32], sub: &[f32]) {
    let sub = &sub[..x.len()];
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 {
        // SAFETY: AVX-512F was detected on this CPU; lengths are equal.
        return unsafe { avx512::exp_sub(x, sub) };
    }
    x.iter_mut().zip(sub).for_each(|(v, &s)| *v = simd::exp(*v - s));
}

/// One online-softmax step over a transposed score tile `st (kn, qn)`, row stride `ld` (row `c`
/// holds key `c` for every query): per query `r`, `m_new = max(m, max_c st[c][r])`, `corr = e^{m − m_new}`,
/// `st[c][r] = e^{st[c][r] − m_new}`, `sum = sum·corr + Σ_c st[c][r]`, `m = m_new`.
/// The first tile of a row must hold at least one finite score (so `m_new` is finite).
#[inline(always)]
pub(crate) fn online_softmax_tile(
    st: &mut [f32],
    kn: usize,
    ld: usize,
    m: &mut [f32],
    sum: &mut [f32],
    corr: &mut [f32],
) {
    let qn = m.len();
    assert!(ld >= qn && (kn == 0 || st.len() >= (kn - 1) * ld + qn), "online_softmax_tile: tile out of bounds");
    let (sum, corr) = (&mut sum[..qn], &mut corr[..qn]);
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 {
        // SAFETY: AVX-512F was detected on this CPU; lengths were sliced to match above.
        return unsafe { avx512::online_softmax_tile(st, kn, ld, m, sum, corr) };
    }
    for r in 0..qn {
        let m_new = (0..kn).map(|c| st[c * ld + r]).fold(m[r], f32::max);
        corr[r] = simd::exp(m[r] - m_new);
        let mut s = 0.0;
        for c in 0..kn {
            let p = simd::exp(st[c * ld + r] - m_new);
            st[c * ld + r] = p;
            s += p;
        }
        sum[r] = sum[r] * corr[r] + s;
        m[r] = m_new;
    }
}

/// `Σ_i exp(x[i] − m)`.
#[inline(always)]
pub(crate) fn sum_exp(x: &[f32], m: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 {
        // SAFETY: AVX-512F was detected on this CPU.
        return unsafe { avx512::sum_exp(x, m) };
    }
    simd::sum_map(x, |v| simd::exp(v - m))
}

/// `x[i] = exp(x[i] − m)`, returning `Σ_i x[i]` (a fixed summation order for a given length).
#[inline(always)]
pub(crate) fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 {
        // SAFETY: AVX-512F was detected on this CPU.
        return unsafe { avx512::exp_sub_sum(x, m) };
    }
    x.iter_mut().for_each(|v| *v = simd::exp(*v - m));
    simd::sum_map(x, |v| v)
}

/// `x[i] = exp(x[i] − m) · scale`.
#[inline(always)]
pub(crate) fn exp_scale(x: &mut [f32], m: f32, scale: f32) {
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 {
        // SAFETY: AVX-512F was detected on this CPU.
        return unsafe { avx512::exp_scale(x, m, scale) };
    }
    x.iter_mut().for_each(|v| *v = simd::exp(*v - m) * scale);
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn exp16(x_in: __m512) -> __m512 {
        // Clamping at −87 keeps every intermediate and result a normal float: denormal results
        // would take microcode assists costing ~100 cycles each. Inputs below give exactly 0.
        let keep = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x_in, _mm512_set1_ps(-87.0));
        let x = _mm512_min_ps(_mm512_max_ps(x_in, _mm512_set1_ps(-87.0)), _mm512_set1_ps(88.0));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
            x,
            _mm512_set1_ps(std::f32::consts::LOG2_E),
        ));
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm512_set1_ps(1.0 / 720.0);
        for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n))
    }

    /// Safety: AVX-512F present, `x.len() == sub.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_sub(x: &mut [f32], sub: &[f32]) {
        let n = x.len();
        let (xp, sp) = (x.as_mut_ptr(), sub.as_ptr());
        let mut i = 0;
        while i + 16 <= n {
            let v = _mm512_sub_ps(_mm512_loadu_ps(xp.add(i)), _mm512_loadu_ps(sp.add(i)));
            _mm512_storeu_ps(xp.add(i), exp16(v));
            i += 16;
        }
        if i < n {
            let k: __mmask16 = (1u32 << (n - i)) as u16 - 1;
            let v = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, xp.add(i)), _mm512_maskz_loadu_ps(k, sp.add(i)));
            _mm512_mask_storeu_ps(xp.add(i), k, exp16(v));
        }
    }

    /// Load/store of 16 lanes: plain when the whole vector is in range (`FULL`), else masked
    /// (masked accesses are kept off the hot path: they stall later loads on this CPU).
    #[inline(always)]
    unsafe fn load<const FULL: bool>(k: __mmask16, p: *const f32) -> __m512 {
        if FULL {
            _mm512_loadu_ps(p)
        } else {
            _mm512_maskz_loadu_ps(k, p)
        }
    }

    #[inline(always)]
    unsafe fn store<const FULL: bool>(k: __mmask16, p: *mut f32, v: __m512) {
        if FULL {
            _mm512_storeu_ps(p, v)
        } else {
            _mm512_mask_storeu_ps(p, k, v)
        }
    }

    /// Safety: AVX-512F present; `st` holds `kn` rows of stride `ld ≥ m.len()`, `sum` and
    /// `corr` are as long as `m`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn online_softmax_tile(
        st: &mut [f32],
        kn: usize,
        ld: usize,
        m: &mut [f32],
        sum: &mut [f32],
        corr: &mut [f32],
    ) {
        let qn = m.len();
        // 16 queries at a time: their statistics live in registers while the kn keys stream.
        let mut j = 0;
        while j + 16 <= qn {
            softmax_columns::<true>(st, kn, ld, j, 0xffff, m, sum, corr);
            j += 16;
        }
        if j < qn {
            softmax_columns::<false>(st, kn, ld, j, ((1u32 << (qn - j)) - 1) as u16, m, sum, corr);
        }
    }

    /// [`online_softmax_tile`] for the 16 queries from `j` (lanes outside `k` untouched).
    #[inline]
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn softmax_columns<const FULL: bool>(
        st: &mut [f32],
        kn: usize,
        ld: usize,
        j: usize,
        k: __mmask16,
        m: &mut [f32],
        sum: &mut [f32],
        corr: &mut [f32],
    ) {
        let sp = st.as_mut_ptr().add(j);
        let m_old = load::<FULL>(k, m.as_ptr().add(j));
        // Four independent max chains (vmaxps latency would otherwise serialise the rows).
        let mut mx = [m_old; 4];
        let mut c = 0;
        while c + 4 <= kn {
            for (u, acc) in mx.iter_mut().enumerate() {
                *acc = _mm512_max_ps(*acc, _mm512_mask_blend_ps(k, *acc, load::<FULL>(k, sp.add((c + u) * ld))));
            }
            c += 4;
        }
        while c < kn {
            mx[0] = _mm512_max_ps(mx[0], _mm512_mask_blend_ps(k, mx[0], load::<FULL>(k, sp.add(c * ld))));
            c += 1;
        }
        let mx = _mm512_max_ps(_mm512_max_ps(mx[0], mx[1]), _mm512_max_ps(mx[2], mx[3]));
        let cr = exp16(_mm512_sub_ps(m_old, mx));
        let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut c = 0;
        while c + 2 <= kn {
            let e0 = exp16(_mm512_sub_ps(load::<FULL>(k, sp.add(c * ld)), mx));
            let e1 = exp16(_mm512_sub_ps(load::<FULL>(k, sp.add((c + 1) * ld)), mx));
            store::<FULL>(k, sp.add(c * ld), e0);
            store::<FULL>(k, sp.add((c + 1) * ld), e1);
            s0 = _mm512_add_ps(s0, e0);
            s1 = _mm512_add_ps(s1, e1);
            c += 2;
        }
        if c < kn {
            let e0 = exp16(_mm512_sub_ps(load::<FULL>(k, sp.add(c * ld)), mx));
            store::<FULL>(k, sp.add(c * ld), e0);
            s0 = _mm512_add_ps(s0, e0);
        }
        let s_old = load::<FULL>(k, sum.as_ptr().add(j));
        store::<FULL>(k, sum.as_mut_ptr().add(j), _mm512_fmadd_ps(s_old, cr, _mm512_add_ps(s0, s1)));
        store::<FULL>(k, corr.as_mut_ptr().add(j), cr);
        store::<FULL>(k, m.as_mut_ptr().add(j), mx);
    }

    /// Safety: AVX-512F present.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn sum_exp(x: &[f32], m: f32) -> f32 {
        let (n, xp, mv) = (x.len(), x.as_ptr(), _mm512_set1_ps(m));
        // Two accumulators hide the add latency behind the exp work of the next block.
        let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut i = 0;
        while i + 32 <= n {
            a0 = _mm512_add_ps(a0, exp16(_mm512_sub_ps(_mm512_loadu_ps(xp.add(i)), mv)));
            a1 = _mm512_add_ps(a1, exp16(_mm512_sub_ps(_mm512_loadu_ps(xp.add(i + 16)), mv)));
            i += 32;
        }
        while i < n {
            let k: __mmask16 = if n - i >= 16 { 0xffff } else { ((1u32 << (n - i)) - 1) as u16 };
            let e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, xp.add(i)), mv));
            a0 = _mm512_mask_add_ps(a0, k, a0, e);
            i += 16;
        }
        _mm512_reduce_add_ps(_mm512_add_ps(a0, a1))
    }

    /// Safety: AVX-512F present.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
        let (n, xp, mv) = (x.len(), x.as_mut_ptr(), _mm512_set1_ps(m));
        let mut acc = _mm512_setzero_ps();
        let mut i = 0;
        while i < n {
            let k: __mmask16 = if n - i >= 16 { 0xffff } else { ((1u32 << (n - i)) - 1) as u16 };
            let e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, xp.add(i)), mv));
            _mm512_mask_storeu_ps(xp.add(i), k, e);
            acc = _mm512_mask_add_ps(acc, k, acc, e);
            i += 16;
        }
        _mm512_reduce_add_ps(acc)
    }

    /// Safety: AVX-512F present.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_scale(x: &mut [f32], m: f32, scale: f32) {
        let (n, xp) = (x.len(), x.as_mut_ptr());
        let (mv, sv) = (_mm512_set1_ps(m), _mm512_set1_ps(scale));
        let mut i = 0;
        while i < n {
            let k: __mmask16 = if n - i >= 16 { 0xffff } else { ((1u32 << (n - i)) - 1) as u16 };
            let e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, xp.add(i)), mv));
            _mm512_mask_storeu_ps(xp.add(i), k, _mm512_mul_ps(e, sv));
            i += 16;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Relative error ≤ 4e-7 against f64 over the softmax range, exact 0 for −∞, both paths.
    #[test]
    fn slice_exp_matches_f64() {
        let x: Vec<f32> = (0..4903).map(|i| -90.0 + i as f32 * 0.0357).chain([f32::NEG_INFINITY, -1e30]).collect();
        let mut y = x.clone();
        exp_sub(&mut y, &vec![0.5; x.len()]);
        let mut z = x.clone();
        exp_scale(&mut z, 0.5, 2.0);

        let s = sum_exp(&x, 0.5);
        let mut want_sum = 0.0f64;
        for i in 0..x.len() {
            // The argument x − 0.5 is rounded to f32 first, as the kernels compute it.
            let want = ((x[i] - 0.5) as f64).exp();
            want_sum += want;
            let tol = 4e-7 * want + 1e-37;
            assert!((y[i] as f64 - want).abs() <= tol, "exp_sub({}) = {} want {want}", x[i], y[i]);
            assert!((z[i] as f64 - 2.0 * want).abs() <= 2.0 * tol, "exp_scale({}) = {}", x[i], z[i]);
        }
        assert!((s as f64 - want_sum).abs() <= 1e-6 * want_sum, "sum_exp {s} want {want_sum}");
    }

    /// Two online steps over a (kn=5, qn=21) tile equal a one-shot softmax normaliser in f64
    /// (relative 1e-6), with −∞ (masked) scores giving exactly 0.
    #[test]
    fn online_softmax_tile_matches_f64() {
        let (kn, qn) = (5, 21);
        let score = |c: usize, r: usize| ((c * 37 + r * 11) % 17) as f32 * 0.7 - 4.0;
        let (mut m, mut sum, mut corr) = (vec![f32::NEG_INFINITY; qn], vec![0.0f32; qn], vec![0.0f32; qn]);
        let mut all: Vec<Vec<f64>> = vec![Vec::new(); qn];
        for step in 0..2 {
            let mut st: Vec<f32> = (0..kn * qn).map(|i| score(i / qn + step * kn, i % qn)).collect();
            if step == 0 {
                st[3] = f32::NEG_INFINITY;
            }
            online_softmax_tile(&mut st, kn, qn, &mut m, &mut sum, &mut corr);
            for c in 0..kn {
                for (r, col) in all.iter_mut().enumerate() {
                    let s =
                        if step == 0 && c == 0 && r == 3 { f64::NEG_INFINITY } else { score(c + step * kn, r) as f64 };
                    col.push(s);
                    let want = (s - m[r] as f64).exp();
                    assert!((st[c * qn + r] as f64 - want).abs() <= 1e-6 * want, "p[{c}][{r}]");
                }
            }
        }
        for (r, col) in all.iter().enumerate() {
            let mx = col.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = col.iter().map(|s| (s - mx).exp()).sum();
            assert!((m[r] as f64 - mx).abs() < 1e-6 && (sum[r] as f64 - z).abs() <= 1e-6 * z, "row {r}");
        }
    }
}
