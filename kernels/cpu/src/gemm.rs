//! Matmul through the `gemm` crate (AVX-512 microkernels with the `x86-v4` feature). Transposed
//! operands are described by strides, never copied; the bias is written into `C` first and the
//! product accumulated on top, so the whole op is one pass of the gemm kernel.

use crate::check::{f32s, f32s_mut, floats, floats_mut, is_half, numel};
use crate::gemm_half::{gemm_half, Kernel};
use crate::CpuBackend;
use gemm::Parallelism;
use megatron_core::anyhow::bail;
use megatron_core::{DeviceTensor, GemmOps, GemmSpec, HostBuffer, MemoryOps, Result};
use rayon::prelude::*;

/// A strided read-only matrix operand: element `(r, c)` is `data[off + r*rs + c*cs]`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a> {
    pub data: &'a [f32],
    pub off: usize,
    pub rs: usize,
    pub cs: usize,
}

/// `dst[m×n] (row stride dst_rs) = dst_scale*dst + prod_scale * lhs[m×k]·rhs[k×n]`
/// (`dst` is not read when `dst_scale == 0`). Bounds are checked, so this is safe to call.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_strided(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    dst_rs: usize,
    dst_scale: f32,
    lhs: Mat,
    rhs: Mat,
    prod_scale: f32,
    par: Parallelism,
) {
    if m == 0 || n == 0 {
        return;
    }
    let last = |x: &Mat, r: usize, c: usize| x.off + (r - 1) * x.rs + (c - 1) * x.cs;
    assert!((m - 1) * dst_rs + n <= dst.len(), "gemm_strided: dst out of bounds");
    if k == 0 {
        dst.chunks_mut(dst_rs).take(m).for_each(|r| r[..n].iter_mut().for_each(|v| *v *= dst_scale));
        return;
    }
    assert!(last(&lhs, m, k) < lhs.data.len(), "gemm_strided: lhs out of bounds");
    assert!(last(&rhs, k, n) < rhs.data.len(), "gemm_strided: rhs out of bounds");
    // SAFETY: every element the kernel touches is inside the slices (checked above), `dst` is
    // exclusively borrowed and cannot alias the shared `lhs`/`rhs`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            dst_scale != 0.0,
            lhs.data.as_ptr().add(lhs.off),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr().add(rhs.off),
            rhs.cs as isize,
            rhs.rs as isize,
            dst_scale,
            prod_scale,
            false,
            false,
            false,
            par,
        );
    }
}

/// Rows per block when the `A` operand is transposed and tall (see [`gemm_op`]).
const TRANS_A_ROW_BLOCK: usize = 4096;

pub(crate) fn gemm_op(
    a: &DeviceTensor,
    b: &DeviceTensor,
    c: &mut DeviceTensor,
    spec: GemmSpec,
    bias: Option<&DeviceTensor>,
    bf16_kernel: Kernel,
) -> Result<()> {
    let GemmSpec { m, n, k, trans_a, trans_b, alpha, beta } = spec;
    let a_shape = if trans_a { format!("[k={k}, m={m}] (trans_a)") } else { format!("[m={m}, k={k}]") };
    let b_shape = if trans_b { format!("[n={n}, k={k}] (trans_b)") } else { format!("[k={k}, n={n}]") };
    numel("gemm", "a", a, m * k, &a_shape)?;
    numel("gemm", "b", b, k * n, &b_shape)?;
    numel("gemm", "c", c, m * n, &format!("[m={m}, n={n}]"))?;
    if is_half(a) || is_half(b) || is_half(c) || bias.is_some_and(is_half) {
        // bf16/fp16/mixed: the packed kernels of `gemm_half` (f32 accumulation, one rounding).
        let (av, bv) = (floats("gemm", "a", a)?, floats("gemm", "b", b)?);
        let biasv = match bias {
            Some(t) => {
                numel("gemm", "bias", t, n, &format!("a bias of length n={n}"))?;
                floats("gemm", "bias", t)?;
                Some(t.host_buffer()?.to_f32_vec())
            }
            None => None,
        };
        if !alpha.is_finite() || !beta.is_finite() {
            bail!("cpu backend: `gemm` needs finite alpha and beta, got alpha={alpha} beta={beta}");
        }
        let cv = floats_mut("gemm", "c", c)?;
        gemm_half(bf16_kernel, m, n, k, av, trans_a, bv, trans_b, alpha, beta, biasv.as_deref(), cv);
        return Ok(());
    }
    let av = f32s("gemm", "a", a)?;
    let bv = f32s("gemm", "b", b)?;
    let biasv = match bias {
        Some(t) => {
            numel("gemm", "bias", t, n, &format!("a bias of length n={n}"))?;
            Some(f32s("gemm", "bias", t)?)
        }
        None => None,
    };
    let cv = f32s_mut("gemm", "c", c)?;
    if !alpha.is_finite() || !beta.is_finite() {
        bail!("cpu backend: `gemm` needs finite alpha and beta, got alpha={alpha} beta={beta}");
    }
    let lhs = if trans_a { Mat { data: av, off: 0, rs: 1, cs: m } } else { Mat { data: av, off: 0, rs: k, cs: 1 } };
    let rhs = if trans_b { Mat { data: bv, off: 0, rs: 1, cs: k } } else { Mat { data: bv, off: 0, rs: n, cs: 1 } };
    let mut dst_scale = beta;
    if let Some(bias) = biasv {
        // C = beta*C + bias, then C += alpha*A·B inside the kernel.
        cv.par_chunks_mut(n).for_each(|row| {
            if beta == 0.0 {
                row.copy_from_slice(bias);
            } else {
                row.iter_mut().zip(bias).for_each(|(c, &b)| *c = beta * *c + b);
            }
        });
        dst_scale = 1.0;
    }
    if trans_a && m > 2 * TRANS_A_ROW_BLOCK {
        // A transposed A with many rows (the LM head's weight gradient, m = vocab) is read with
        // a stride of m floats; in blocks of rows the gemm crate runs ~15% faster here
        // (the tiny config's 50304x256x2048 TN: 165 -> 195 GFLOP/s in an interleaved A/B timing).
        for (i, rows) in cv.chunks_mut(TRANS_A_ROW_BLOCK * n).enumerate() {
            let mc = rows.len() / n;
            let block = Mat { off: i * TRANS_A_ROW_BLOCK, ..lhs };
            gemm_strided(mc, n, k, rows, n, dst_scale, block, rhs, alpha, Parallelism::Rayon(0));
        }
    } else {
        gemm_strided(m, n, k, cv, n, dst_scale, lhs, rhs, alpha, Parallelism::Rayon(0));
    }
    Ok(())
}

/// Times `C[m,n] = A[m,k]·B[n,k]^T` (a Linear forward) on `backend` and returns GFLOP/s
/// (`2mnk` flops per call; the median of `reps` runs after one warm-up).
pub fn measure_gemm_gflops(backend: &CpuBackend, m: usize, n: usize, k: usize, reps: usize) -> Result<f64> {
    let a = backend.from_host(HostBuffer::F32((0..m * k).map(|i| (i % 7) as f32 * 0.01).collect()), &[m, k])?;
    let b = backend.from_host(HostBuffer::F32((0..n * k).map(|i| (i % 5) as f32 * 0.01).collect()), &[n, k])?;
    let mut c = backend.zeros(&[m, n], megatron_core::DType::F32)?;
    let spec = GemmSpec::linear(m, n, k);
    backend.gemm(&a, &b, &mut c, spec, None)?;
    let mut times = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        let t = std::time::Instant::now();
        backend.gemm(&a, &b, &mut c, spec, None)?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(2.0 * m as f64 * n as f64 * k as f64 / times[times.len() / 2] / 1e9)
}
