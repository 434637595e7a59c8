//! GEMM for bf16/fp16 and mixed-dtype operands: packed panels, f32 accumulation, fused
//! transposes, `alpha`/`beta`/bias epilogue and rounding into the output's dtype.
//!
//! Two microkernels share one packing scheme and one driver:
//! * **`dp`** (bf16 × bf16 on CPUs with AVX512-BF16): `vdpbf16ps` multiplies a broadcast pair
//!   of bf16 from `A` with 16 pairs from `B` and adds both exact products into f32 lanes, so a
//!   512-bit instruction does 64 flops (twice an f32 FMA);
//! * **`fma`** (the fallback, and fp16 / mixed dtypes): operands widened to f32 while packing
//!   (exact), then f32 FMAs in a loop LLVM vectorises for AVX-512/AVX2.
//!
//! Blocking: `A` is packed per task in `MC × KC` blocks of `MR`-row panels, `B` once for the
//! whole call in `KC × NR` panels (the only full-size temporary: bf16 for `dp`, f32 for `fma`).
//! Tasks are `(row block, column range)` tiles of `C`; every task runs the whole `K` loop for
//! its tile, in a fixed order, so **K is never split across threads** and each element of `C`
//! is computed by the same instruction sequence whatever the thread count or tile split
//! (zero-padded edge panels run the same kernel). Partial sums across `KC` blocks stay in an
//! f32 tile (never in a half `C`); the epilogue `C = alpha·acc + beta·C + bias` runs once.

mod driver;
mod micro;
mod pack;
mod pack_dp;

pub use micro::bf16_dot_peak_gflops;

use driver::{run_tasks, CPtr, Job};
use megatron_core::half::{bf16, f16};
use pack::{pack_a_panel, pack_b_all, pack_b_generic};
use pack_dp::pack_dp;

/// Rows of a microkernel tile.
pub(crate) const MR: usize = 8;
/// 16-lane f32 vectors per microkernel row.
const NV: usize = 3;
/// Columns of a microkernel tile.
pub(crate) const NR: usize = 16 * NV;
/// `K` elements per packed block (even: `dp` consumes pairs).
const KC: usize = 384;
/// Rows of `C` per task (a multiple of `MR`).
const MC: usize = 128;
/// Tasks to aim for (enough for a few cores to balance).
const MIN_TASKS: usize = 16;

/// A read-only operand of any float dtype.
#[derive(Clone, Copy)]
pub(crate) enum Src<'a> {
    F32(&'a [f32]),
    BF16(&'a [bf16]),
    F16(&'a [f16]),
}

/// The output `C` of any float dtype.
pub(crate) enum Dst<'a> {
    F32(&'a mut [f32]),
    BF16(&'a mut [bf16]),
    F16(&'a mut [f16]),
}

/// Which microkernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// AVX512-BF16 `vdpbf16ps` (bf16 × bf16 only).
    Dp,
    /// Widened f32 FMAs.
    Fma,
}

/// Whether this CPU runs `vdpbf16ps` (AVX512-BF16 with AVX-512F).
pub fn bf16_dot_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
/// `C = alpha·op(A)·op(B) + beta·C (+ bias)` for half/mixed dtypes (shapes already checked).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_half(
    kernel: Kernel,
    m: usize,
    n: usize,
    k: usize,
    a: Src,
    trans_a: bool,
    b: Src,
    trans_b: bool,
    alpha: f32,
    beta: f32,
    bias: Option<&[f32]>,
    c: Dst,
) {
    if m == 0 || n == 0 {
        return;
    }
    let cptr = match c {
        Dst::F32(v) => CPtr::F32(v.as_mut_ptr()),
        Dst::BF16(v) => CPtr::BF16(v.as_mut_ptr()),
        Dst::F16(v) => CPtr::F16(v.as_mut_ptr()),
    };
    let job = Job { m, n, k, alpha, beta, bias, c: cptr };
    match (kernel, a, b) {
        (Kernel::Dp, Src::BF16(a), Src::BF16(b)) if bf16_dot_supported() => {
            // B `[k, n]` is k-strided, `[n, k]` (trans) k-contiguous; A the other way round.
            let (ldb, lda) = (if trans_b { k } else { n }, if trans_a { m } else { k });
            let pb = pack_b_all(k, n, |k0, kc, j0, out: &mut [u16]| {
                pack_dp(b, trans_b, ldb, j0, NR.min(n - j0), k0, kc, NR, out)
            });
            run_tasks(&job, &pb, |i0, k0, kc, out: &mut [u16]| {
                pack_dp(a, !trans_a, lda, i0, MR.min(m.saturating_sub(i0)), k0, kc, MR, out)
            });
        }
        _ => {
            let pb = match b {
                Src::F32(b) => pack_b_generic::<f32, [f32], false>(b, trans_b, k, n),
                Src::BF16(b) => pack_b_generic::<f32, [bf16], false>(b, trans_b, k, n),
                Src::F16(b) => pack_b_generic::<f32, [f16], false>(b, trans_b, k, n),
            };
            run_tasks(&job, &pb, |i0, k0, kc, out: &mut [f32]| match a {
                Src::F32(a) => pack_a_panel::<f32, [f32], false>(a, trans_a, m, k, i0, k0, kc, out),
                Src::BF16(a) => pack_a_panel::<f32, [bf16], false>(a, trans_a, m, k, i0, k0, kc, out),
                Src::F16(a) => pack_a_panel::<f32, [f16], false>(a, trans_a, m, k, i0, k0, kc, out),
            });
        }
    }
}
