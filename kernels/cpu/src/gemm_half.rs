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

use megatron_core::half::{bf16, f16};
use rayon::prelude::*;
use std::cell::RefCell;

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

/// A packed element: bf16 bits for `dp`, f32 for `fma`.
trait Elem: Copy + Send + Sync + 'static {
    const ZERO: Self;
}
impl Elem for u16 {
    const ZERO: u16 = 0;
}
impl Elem for f32 {
    const ZERO: f32 = 0.0;
}

/// Reads element `i` of a source slice as a packed element.
trait Load<E>: Sync {
    fn at(&self, i: usize) -> E;
}
impl Load<u16> for [bf16] {
    #[inline(always)]
    fn at(&self, i: usize) -> u16 {
        self[i].to_bits()
    }
}
impl Load<f32> for [bf16] {
    #[inline(always)]
    fn at(&self, i: usize) -> f32 {
        self[i].to_f32()
    }
}
impl Load<f32> for [f16] {
    #[inline(always)]
    fn at(&self, i: usize) -> f32 {
        self[i].to_f32()
    }
}
impl Load<f32> for [f32] {
    #[inline(always)]
    fn at(&self, i: usize) -> f32 {
        self[i]
    }
}

/// Position of element `(p, x, h)` (pair `p`, row/column `x` of the panel of width `w`, half
/// `h` of the pair) in a packed panel. `dp` interleaves the pair (the `vdpbf16ps` lane
/// layout); `fma` keeps whole k-rows contiguous so its loads are plain vectors.
#[inline(always)]
fn pos<const DP: bool>(p: usize, x: usize, h: usize, w: usize) -> usize {
    if DP {
        (p * w + x) * 2 + h
    } else {
        (2 * p + h) * w + x
    }
}

/// Packs `A` rows `[i0, i0 + MR)` × k `[k0, k0 + kc)` into one `MR` panel (zero padded).
/// `A` is `[m, k]`, or `[k, m]` when `trans`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn pack_a_panel<E: Elem, S: Load<E> + ?Sized, const DP: bool>(
    a: &S,
    trans: bool,
    m: usize,
    k: usize,
    i0: usize,
    k0: usize,
    kc: usize,
    out: &mut [E],
) {
    let kp = kc.div_ceil(2);
    let rows = MR.min(m.saturating_sub(i0));
    if rows < MR || kc % 2 == 1 {
        out[..kp * 2 * MR].fill(E::ZERO);
    }
    if trans {
        for kk in 0..kc {
            let base = (k0 + kk) * m + i0;
            for r in 0..rows {
                out[pos::<DP>(kk / 2, r, kk % 2, MR)] = a.at(base + r);
            }
        }
    } else {
        for r in 0..rows {
            let base = (i0 + r) * k + k0;
            for kk in 0..kc {
                out[pos::<DP>(kk / 2, r, kk % 2, MR)] = a.at(base + kk);
            }
        }
    }
}

/// Packs `B` k `[k0, k0 + kc)` × columns `[j0, j0 + NR)` into one `NR` panel (zero padded).
/// `B` is `[k, n]`, or `[n, k]` when `trans`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn pack_b_panel<E: Elem, S: Load<E> + ?Sized, const DP: bool>(
    b: &S,
    trans: bool,
    k: usize,
    n: usize,
    k0: usize,
    kc: usize,
    j0: usize,
    out: &mut [E],
) {
    let kp = kc.div_ceil(2);
    let cols = NR.min(n.saturating_sub(j0));
    if cols < NR || kc % 2 == 1 {
        out[..kp * 2 * NR].fill(E::ZERO);
    }
    if trans {
        for c in 0..cols {
            let base = (j0 + c) * k + k0;
            for kk in 0..kc {
                out[pos::<DP>(kk / 2, c, kk % 2, NR)] = b.at(base + kk);
            }
        }
    } else {
        for kk in 0..kc {
            let base = (k0 + kk) * n + j0;
            for c in 0..cols {
                out[pos::<DP>(kk / 2, c, kk % 2, NR)] = b.at(base + c);
            }
        }
    }
}

/// The `KC` blocks of `K`: `(k0, kc)`.
fn k_blocks(k: usize) -> Vec<(usize, usize)> {
    (0..k).step_by(KC).map(|k0| (k0, KC.min(k - k0))).collect()
}

/// All of `B` packed: for each k block, `ceil(n/NR)` panels of `ceil(kc/2)·2·NR` elements.
fn pack_b_all<E: Elem, S: Load<E> + ?Sized, const DP: bool>(b: &S, trans: bool, k: usize, n: usize) -> Vec<E> {
    let panels = n.div_ceil(NR);
    let mut packed = vec![E::ZERO; k.div_ceil(2) * 2 * panels * NR];
    let mut rest = &mut packed[..];
    let mut blocks = Vec::new();
    for (k0, kc) in k_blocks(k) {
        let (blk, tail) = std::mem::take(&mut rest).split_at_mut(kc.div_ceil(2) * 2 * panels * NR);
        rest = tail;
        blocks.push((k0, kc, blk));
    }
    blocks.into_par_iter().for_each(|(k0, kc, blk)| {
        blk.par_chunks_mut(kc.div_ceil(2) * 2 * NR)
            .enumerate()
            .for_each(|(jr, panel)| pack_b_panel::<E, S, DP>(b, trans, k, n, k0, kc, jr * NR, panel));
    });
    packed
}

/// Raw access to `C` for tasks that own disjoint tiles.
#[derive(Clone, Copy)]
enum CPtr {
    F32(*mut f32),
    BF16(*mut bf16),
    F16(*mut f16),
}
// SAFETY: tasks write disjoint elements of the exclusively borrowed `C` (see `run_tasks`).
unsafe impl Send for CPtr {}
unsafe impl Sync for CPtr {}

/// Problem description shared by every task.
struct Job<'a> {
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    beta: f32,
    bias: Option<&'a [f32]>,
    c: CPtr,
}

thread_local! {
    static PACK_U16: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
    static PACK_F32: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static TILE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's scratch vector resized to `n` (contents unspecified).
fn with_scratch<T: Elem, R>(
    key: &'static std::thread::LocalKey<RefCell<Vec<T>>>,
    n: usize,
    f: impl FnOnce(&mut [T]) -> R,
) -> R {
    let mut buf = key.with(|c| std::mem::take(&mut *c.borrow_mut()));
    if buf.len() < n {
        buf.resize(n, T::ZERO);
    }
    let r = f(&mut buf[..n]);
    key.with(|c| *c.borrow_mut() = buf);
    r
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
            let pb = pack_b_all::<u16, [bf16], true>(b, trans_b, k, n);
            run_tasks(&job, &pb, |i0, k0, kc, out: &mut [u16]| {
                pack_a_panel::<u16, [bf16], true>(a, trans_a, m, k, i0, k0, kc, out)
            });
        }
        _ => {
            let pb = match b {
                Src::F32(b) => pack_b_all::<f32, [f32], false>(b, trans_b, k, n),
                Src::BF16(b) => pack_b_all::<f32, [bf16], false>(b, trans_b, k, n),
                Src::F16(b) => pack_b_all::<f32, [f16], false>(b, trans_b, k, n),
            };
            run_tasks(&job, &pb, |i0, k0, kc, out: &mut [f32]| match a {
                Src::F32(a) => pack_a_panel::<f32, [f32], false>(a, trans_a, m, k, i0, k0, kc, out),
                Src::BF16(a) => pack_a_panel::<f32, [bf16], false>(a, trans_a, m, k, i0, k0, kc, out),
                Src::F16(a) => pack_a_panel::<f32, [f16], false>(a, trans_a, m, k, i0, k0, kc, out),
            });
        }
    }
}

/// A packed element type together with its microkernel.
trait Micro: Elem {
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

/// Splits `C` into tasks and runs them on the current rayon pool.
fn run_tasks<E: Micro>(job: &Job, pb: &[E], pack_a: impl Fn(usize, usize, usize, &mut [E]) + Sync) {
    let (m, n) = (job.m, job.n);
    let m_blocks = m.div_ceil(MC);
    let panels = n.div_ceil(NR);
    // Column split only to have enough tasks; it changes which task computes an element, never how.
    let n_split = MIN_TASKS.div_ceil(m_blocks).clamp(1, panels);
    let per = panels.div_ceil(n_split);
    let tasks: Vec<(usize, usize, usize)> = (0..m_blocks)
        .flat_map(|ib| (0..panels).step_by(per).map(move |jr0| (ib, jr0, (jr0 + per).min(panels))))
        .collect();
    tasks.into_par_iter().for_each(|(ib, jr0, jr1)| task::<E>(job, pb, &pack_a, ib * MC, jr0, jr1));
}

/// Rows `[i0, i0+MC)` × panels `[jr0, jr1)` of `C`.
fn task<E: Micro>(
    job: &Job,
    pb: &[E],
    pack_a: &impl Fn(usize, usize, usize, &mut [E]),
    i0: usize,
    jr0: usize,
    jr1: usize,
) {
    let (m, n, k) = (job.m, job.n, job.k);
    let mc = MC.min(m - i0);
    let mpanels = mc.div_ceil(MR);
    let blocks = k_blocks(k);
    let panels = n.div_ceil(NR);
    let tile_w = (jr1 - jr0) * NR;
    let tile_len = if blocks.len() > 1 { mpanels * MR * tile_w } else { 0 };
    with_scratch(E::scratch(), mpanels * KC * MR, |pa| {
        with_scratch(&TILE, tile_len, |tile| {
            if blocks.is_empty() {
                // K = 0: only the epilogue (alpha·0 + beta·C + bias).
                let acc = [[0.0f32; NR]; MR];
                for jr in jr0..jr1 {
                    for ir in 0..mpanels {
                        epilogue(job, &acc, i0 + ir * MR, jr * NR, None);
                    }
                }
                return;
            }
            let mut kbase = 0; // pairs before this block
            for (bi, &(k0, kc)) in blocks.iter().enumerate() {
                let kp = kc.div_ceil(2);
                let panel_a = kp * 2 * MR;
                for ir in 0..mpanels {
                    pack_a(i0 + ir * MR, k0, kc, &mut pa[ir * panel_a..(ir + 1) * panel_a]);
                }
                let (first, last) = (bi == 0, bi + 1 == blocks.len());
                let block_b = &pb[kbase * 2 * panels * NR..];
                let mut acc = [[0.0f32; NR]; MR];
                for jr in jr0..jr1 {
                    let bpanel = &block_b[jr * kp * 2 * NR..(jr + 1) * kp * 2 * NR];
                    for ir in 0..mpanels {
                        E::kernel(kp, &pa[ir * panel_a..(ir + 1) * panel_a], bpanel, &mut acc);
                        let t_off = ir * MR * tile_w + (jr - jr0) * NR;
                        if last {
                            let partial = (!first).then(|| &tile[t_off..]);
                            epilogue(job, &acc, i0 + ir * MR, jr * NR, partial.map(|t| (t, tile_w)));
                        } else {
                            for (r, row) in acc.iter().enumerate() {
                                let t = &mut tile[t_off + r * tile_w..t_off + r * tile_w + NR];
                                if first {
                                    t.copy_from_slice(row);
                                } else {
                                    t.iter_mut().zip(row).for_each(|(t, &x)| *t += x);
                                }
                            }
                        }
                    }
                }
                kbase += kp;
            }
        })
    })
}

/// Writes one microtile: `C = alpha·(acc + partial) + beta·C + bias`, rounded to `C`'s dtype.
#[inline(always)]
fn epilogue(job: &Job, acc: &[[f32; NR]; MR], i0: usize, j0: usize, partial: Option<(&[f32], usize)>) {
    let rows = MR.min(job.m.saturating_sub(i0));
    let cols = NR.min(job.n - j0);
    let mut v = [0.0f32; NR];
    for (r, row) in acc.iter().enumerate().take(rows) {
        let v = &mut v[..cols];
        v.copy_from_slice(&row[..cols]);
        if let Some((t, w)) = partial {
            v.iter_mut().zip(&t[r * w..r * w + cols]).for_each(|(x, &p)| *x += p);
        }
        v.iter_mut().for_each(|x| *x *= job.alpha);
        if let Some(bias) = job.bias {
            v.iter_mut().zip(&bias[j0..j0 + cols]).for_each(|(x, &b)| *x += b);
        }
        let off = (i0 + r) * job.n + j0;
        // SAFETY: row i0+r < m and columns [j0, j0+cols) < n lie inside `C` (m·n elements), and
        // this microtile belongs to the calling task only.
        unsafe {
            match job.c {
                CPtr::F32(p) => {
                    let c = std::slice::from_raw_parts_mut(p.add(off), cols);
                    if job.beta != 0.0 {
                        v.iter_mut().zip(c.iter()).for_each(|(x, &c)| *x += job.beta * c);
                    }
                    c.copy_from_slice(v);
                }
                CPtr::BF16(p) => {
                    let c = std::slice::from_raw_parts_mut(p.add(off), cols);
                    if job.beta != 0.0 {
                        v.iter_mut().zip(c.iter()).for_each(|(x, &c)| *x += job.beta * c.to_f32());
                    }
                    c.iter_mut().zip(v.iter()).for_each(|(c, &x)| *c = bf16::from_f32(x));
                }
                CPtr::F16(p) => {
                    let c = std::slice::from_raw_parts_mut(p.add(off), cols);
                    if job.beta != 0.0 {
                        v.iter_mut().zip(c.iter()).for_each(|(x, &c)| *x += job.beta * c.to_f32());
                    }
                    c.iter_mut().zip(v.iter()).for_each(|(c, &x)| *c = f16::from_f32(x));
                }
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
