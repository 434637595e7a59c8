//! The microkernels: `vdpbf16ps` (`dp`) and widened f32 FMA (`fma`) over packed panels, and
//! the register-only peak loops the GEMM rates are measured against.

use super::driver::{PACK_F32, PACK_U16};
use super::pack::Elem;
use super::{bf16_dot_supported, MR, NR, NV};
use rayon::prelude::*;
use std::cell::RefCell;

/// A packed element type together with its microkernel.
pub(super) trait Micro: Elem {
    fn scratch() -> &'static std::thread::LocalKey<RefCell<Vec<Self>>>;
    /// `acc[MR][NR] = Σ_k A_panel(k, r) · B_panel(k, c)` over `kp` pairs.
    fn kernel(kp: usize, a: &[Self], b: &[Self], acc: &mut [[f32; NR]; MR]);
}

impl Micro for u16 {
    fn scratch() -> &'static std::thread::LocalKey<RefCell<Vec<u16>>> {
        &PACK_U16
    }
    #[inline(always)]
    fn kernel(kp: usize, a: &[u16], b: &[u16], acc: &mut [[f32; NR]; MR]) {
        assert!(a.len() >= kp * 2 * MR && b.len() >= kp * 2 * NR, "dp kernel: panel too short");
        #[cfg(target_arch = "x86_64")]
        // SAFETY: only reached through `gemm_half`'s `Kernel::Dp` arm, which checked that the CPU
        // has AVX512-BF16; the panel lengths were checked above.
        unsafe {
            dp::kernel(kp, a.as_ptr(), b.as_ptr(), acc)
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("the dp kernel is only selected on x86-64 CPUs with AVX512-BF16")
    }
}

impl Micro for f32 {
    fn scratch() -> &'static std::thread::LocalKey<RefCell<Vec<f32>>> {
        &PACK_F32
    }
    #[inline(always)]
    fn kernel(kp: usize, a: &[f32], b: &[f32], acc: &mut [[f32; NR]; MR]) {
        assert!(a.len() >= kp * 2 * MR && b.len() >= kp * 2 * NR, "fma kernel: panel too short");
        #[cfg(target_arch = "x86_64")]
        if crate::simd::level() == crate::simd::Level::Avx512 {
            // SAFETY: AVX-512F was detected; the panel lengths were checked above.
            return unsafe { dp::kernel_fma(2 * kp, a.as_ptr(), b.as_ptr(), acc) };
        }
        fma_kernel(kp, a, b, acc)
    }
}

crate::simd_kernel! {
    /// f32 microkernel over k-row-major panels, k ascending (one FMA chain per element).
    fn fma_kernel(kp: usize, a: &[f32], b: &[f32], acc: &mut [[f32; NR]; MR]) {
        let mut t = [[0.0f32; NR]; MR];
        for (ak, bk) in a.chunks_exact(MR).zip(b.chunks_exact(NR)).take(2 * kp) {
            let bk: &[f32; NR] = bk.try_into().expect("NR columns");
            for (row, &av) in t.iter_mut().zip(ak) {
                for (x, &bv) in row.iter_mut().zip(bk) {
                    *x = av.mul_add(bv, *x);
                }
            }
        }
        *acc = t;
    }
}

#[cfg(target_arch = "x86_64")]
mod dp {
    use super::{MR, NR, NV};
    use std::arch::x86_64::*;

    /// 24 independent `vdpbf16ps` chains, `iters` times (the throughput bound of the kernel).
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX512-BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn peak_loop(iters: u64) -> [__m512; 24] {
        let mut acc = [_mm512_setzero_ps(); 24];
        let a = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(0x3f80_3f80));
        let b = std::hint::black_box(std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(0x3400_3400)));
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm512_dpbf16_ps(*x, a, b);
            }
        }
        acc
    }

    /// The same with f32 FMAs (`vfmadd231ps`).
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn peak_loop_fma(iters: u64) -> [__m512; 24] {
        let mut acc = [_mm512_setzero_ps(); 24];
        let a = _mm512_set1_ps(1.000_1);
        let b = std::hint::black_box(_mm512_set1_ps(1e-7));
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm512_fmadd_ps(a, b, *x);
            }
        }
        acc
    }

    /// The f32 microkernel with explicit AVX-512 FMAs (same tile, k-row-major panels): the
    /// widened path for bf16/fp16/mixed operands on AVX-512 CPUs.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `a` must hold `kk·MR` floats and `b` `kk·NR`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn kernel_fma(kk: usize, a: *const f32, b: *const f32, acc: &mut [[f32; NR]; MR]) {
        let mut t = [[_mm512_setzero_ps(); NV]; MR];
        for p in 0..kk {
            let bp = b.add(p * NR);
            let mut bv = [_mm512_setzero_ps(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = _mm512_loadu_ps(bp.add(v * 16));
            }
            for (r, row) in t.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*a.add(p * MR + r));
                for (x, &bvv) in row.iter_mut().zip(&bv) {
                    *x = _mm512_fmadd_ps(av, bvv, *x);
                }
            }
        }
        for (dst, row) in acc.iter_mut().zip(&t) {
            for (v, x) in row.iter().enumerate() {
                _mm512_storeu_ps(dst.as_mut_ptr().add(v * 16), *x);
            }
        }
    }

    /// # Safety
    /// The CPU must have AVX-512F and AVX512-BF16; `a` must hold `kp·MR` pairs and `b`
    /// `kp·NR` pairs.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn kernel(kp: usize, a: *const u16, b: *const u16, acc: &mut [[f32; NR]; MR]) {
        let mut t = [[_mm512_setzero_ps(); NV]; MR];
        let a = a as *const i32; // one bf16 pair per row and k-pair
        for p in 0..kp {
            let bp = b.add(p * NR * 2);
            let mut bv: [__m512bh; NV] = std::mem::zeroed();
            for (v, x) in bv.iter_mut().enumerate() {
                *x = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(bp.add(v * 32) as *const _));
            }
            for (r, row) in t.iter_mut().enumerate() {
                let av = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(*a.add(p * MR + r)));
                for (x, &bvv) in row.iter_mut().zip(&bv) {
                    *x = _mm512_dpbf16_ps(*x, av, bvv);
                }
            }
        }
        for (dst, row) in acc.iter_mut().zip(&t) {
            for (v, x) in row.iter().enumerate() {
                _mm512_storeu_ps(dst.as_mut_ptr().add(v * 16), *x);
            }
        }
    }
}
/// Register-only throughput of this CPU on `backend`'s threads, in GFLOP/s:
/// `(vdpbf16ps, f32 vfmadd)` (64 and 32 flops per 512-bit instruction), each thread running 24
/// independent accumulator chains for a fixed instruction count. `(0, 0)` without
/// AVX512-BF16. The ceilings the bf16 and f32 GEMMs are measured against.
pub fn bf16_dot_peak_gflops(backend: &crate::CpuBackend) -> (f64, f64) {
    if !bf16_dot_supported() {
        return (0.0, 0.0);
    }
    let threads = backend.threads();
    let iters = 4_000_000u64;
    let rate = |dot: bool| {
        let t = std::time::Instant::now();
        backend.run(|| {
            (0..threads).into_par_iter().with_max_len(1).for_each(|_| {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX512-BF16 and AVX-512F were detected above.
                unsafe {
                    if dot {
                        std::hint::black_box(dp::peak_loop(iters));
                    } else {
                        std::hint::black_box(dp::peak_loop_fma(iters));
                    }
                }
            })
        });
        let flops = if dot { 64 } else { 32 };
        (threads as u64 * iters * 24 * flops) as f64 / t.elapsed().as_secs_f64() / 1e9
    };
    (rate(true), rate(false))
}
