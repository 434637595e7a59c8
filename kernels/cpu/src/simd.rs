//! Run-time SIMD dispatch and the vectorisable math the kernels share.
//!
//! The crate is compiled for baseline x86-64 (SSE2), so hot loops are written as
//! [`crate::simd_kernel!`] functions: compiled once per ISA with `#[target_feature]` and
//! dispatched on the CPU's features, so LLVM emits AVX-512 (or AVX2+FMA) code where the CPU has it.
//! [`exp`] and [`tanh`] are branch-free polynomial versions that LLVM vectorises (the `std`
//! ones are libm calls that it cannot).

use std::sync::OnceLock;

/// The vector ISA kernels are dispatched to (public only for [`crate::simd_kernel!`]).
#[doc(hidden)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Level {
    Baseline,
    Avx2,
    Avx512,
}

#[doc(hidden)]
pub fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512dq")
                && is_x86_feature_detected!("fma")
            {
                return Level::Avx512;
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return Level::Avx2;
            }
        }
        Level::Baseline
    })
}

/// The instruction set the kernels use on this CPU (for benchmark reports).
pub fn simd_level() -> &'static str {
    match level() {
        Level::Baseline => "sse2",
        Level::Avx2 => "avx2+fma",
        Level::Avx512 => "avx512",
    }
}

/// Defines a kernel function that is compiled three times (AVX-512, AVX2+FMA, baseline) and
/// dispatched at run time. The body is an `#[inline(always)]` function, which (unlike a
/// closure) LLVM reliably inlines into the `#[target_feature]` copies, so its loops are
/// vectorised for the wide ISA. Arguments must be plain values or references.
#[macro_export]
#[doc(hidden)]
macro_rules! simd_kernel {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            // Never inlined: each copy keeps its own register allocation (big callers made LLVM
            // spill the accumulator blocks of `tile::matmul` when it was inlined into them).
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,avx,fma,bmi1,bmi2,f16c")]
            #[inline(never)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn avx512($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,avx,fma,bmi1,bmi2,f16c")]
            #[inline(never)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn avx2($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
            match $crate::simd::level() {
                // SAFETY: the features these copies enable were detected on this CPU.
                #[cfg(target_arch = "x86_64")]
                $crate::simd::Level::Avx512 => unsafe { avx512($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                $crate::simd::Level::Avx2 => unsafe { avx2($($arg),*) },
                _ => body($($arg),*),
            }
        }
    };
}

/// `e^x` for `x` in `[-87, 88]` with ≲ 2 ulp relative error (Cephes `expf` polynomial);
/// smaller inputs (including `-inf`) give 0, larger are clamped to `e^88`.
///
/// Uses `mul_add`: inside a [`crate::simd_kernel!`] AVX2/AVX-512 copy that is one FMA
/// instruction (these loops are bound by vector-op throughput, so every saved op counts); on
/// an x86 CPU without FMA it would be a slow libm call, which only the baseline path can hit.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const C1: f32 = 0.693_359_4; // ln 2 split in two (Cody–Waite) so r is exact
    const C2: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5·2^23: adding it rounds to an integer
    let xc = x.clamp(-87.0, 88.0);
    let shifted = xc.mul_add(LOG2E, ROUND);
    let n = shifted - ROUND;
    // n as an integer, read from the mantissa of `shifted` (an `as i32` cast would be a
    // saturating scalar conversion that blocks vectorisation).
    let ni = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    let r = (-n).mul_add(C2, (-n).mul_add(C1, xc));
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let er = (p * r).mul_add(r, r) + 1.0;
    let pow2n = f32::from_bits(ni.wrapping_add(127) << 23);
    let y = er * pow2n;
    if x < -87.0 {
        0.0
    } else {
        y
    }
}

/// `tanh(x) = 1 - 2/(e^{2x}+1)` with [`exp`]: absolute error ≲ 2e-7 everywhere.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    1.0 - 2.0 / (exp(2.0 * x) + 1.0)
}

/// `1/(1+e^{-x})` with [`exp`].
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// Lanes of the split accumulators below: 16 independent sums let LLVM keep one AVX-512
/// register (or two AVX2 ones) of partial sums instead of a serial f32 dependency chain.
const LANES: usize = 16;

/// `Σ f(x_i)` with 16 partial sums (vectorisable; rounding differs from a serial sum only in
/// the order of additions).
#[inline(always)]
pub fn sum_map(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut it = x.chunks_exact(LANES);
    for c in &mut it {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(v);
        }
    }
    let tail: f32 = it.remainder().iter().map(|&v| f(v)).sum();
    acc.iter().sum::<f32>() + tail
}

/// `Σ f(a_i, b_i)` with 16 partial sums.
#[inline(always)]
pub fn sum_map2(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; LANES];
    let (mut ia, mut ib) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    for (ca, cb) in (&mut ia).zip(&mut ib) {
        for ((s, &x), &y) in acc.iter_mut().zip(ca).zip(cb) {
            *s += f(x, y);
        }
    }
    let tail: f32 = ia.remainder().iter().zip(ib.remainder()).map(|(&x, &y)| f(x, y)).sum();
    acc.iter().sum::<f32>() + tail
}

/// `Σ f(a_i, b_i, c_i)` with 16 partial sums.
#[inline(always)]
pub fn sum_map3(a: &[f32], b: &[f32], c: &[f32], f: impl Fn(f32, f32, f32) -> f32) -> f32 {
    let n = a.len().min(b.len()).min(c.len());
    let (a, b, c) = (&a[..n], &b[..n], &c[..n]);
    let mut acc = [0.0f32; LANES];
    let (mut ia, mut ib, mut ic) = (a.chunks_exact(LANES), b.chunks_exact(LANES), c.chunks_exact(LANES));
    for ((ca, cb), cc) in (&mut ia).zip(&mut ib).zip(&mut ic) {
        for (((s, &x), &y), &z) in acc.iter_mut().zip(ca).zip(cb).zip(cc) {
            *s += f(x, y, z);
        }
    }
    let tail: f32 =
        ia.remainder().iter().zip(ib.remainder()).zip(ic.remainder()).map(|((&x, &y), &z)| f(x, y, z)).sum();
    acc.iter().sum::<f32>() + tail
}

/// `max_i x_i` (−∞ for an empty slice), 16 lanes.
#[inline(always)]
pub fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut it = x.chunks_exact(LANES);
    for c in &mut it {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = if v > *a { v } else { *a };
        }
    }
    let m = it.remainder().iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    acc.iter().fold(m, |m, &v| if v > m { v } else { m })
}

#[cfg(test)]
mod tests {
    #[test]
    fn exp_relative_error_below_4e_7() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let want = (x as f64).exp();
            let err = ((super::exp(x) as f64 - want) / want).abs();
            worst = worst.max(err);
            x += 0.0137;
        }
        assert!(worst < 4e-7, "exp worst relative error {worst}");
        assert_eq!(super::exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(super::exp(-100.0), 0.0);
    }

    #[test]
    fn tanh_absolute_error_below_3e_7() {
        let mut worst = 0.0f64;
        let mut x = -20.0f32;
        while x <= 20.0 {
            worst = worst.max((super::tanh(x) as f64 - (x as f64).tanh()).abs());
            x += 0.00731;
        }
        assert!(worst < 3e-7, "tanh worst absolute error {worst}");
    }
}
