//! Packing of the `A` and `B` operands into the microkernels' panel layouts (zero-padded
//! edges, the `vdpbf16ps` pair interleave for `dp`, whole k-rows for `fma`).

use super::{KC, MR, NR};
use megatron_core::half::{bf16, f16};
use rayon::prelude::*;
use std::ops::Deref;
use std::sync::Mutex;

/// A packed element: bf16 bits for `dp`, f32 for `fma`.
pub(super) trait Elem: Copy + Send + Sync + 'static {
    const ZERO: Self;
    /// The pool of this type's packed-`B` buffer (see [`PackedB`]).
    fn pool() -> &'static Mutex<Vec<Self>>;
}
static POOL_U16: Mutex<Vec<u16>> = Mutex::new(Vec::new());
static POOL_F32: Mutex<Vec<f32>> = Mutex::new(Vec::new());
impl Elem for u16 {
    const ZERO: u16 = 0;
    fn pool() -> &'static Mutex<Vec<u16>> {
        &POOL_U16
    }
}
impl Elem for f32 {
    const ZERO: f32 = 0.0;
    fn pool() -> &'static Mutex<Vec<f32>> {
        &POOL_F32
    }
}

/// The packed `B` of one GEMM call, in a buffer borrowed from a process-wide pool and given
/// back when dropped: the lm head packs ~77 MB of bf16 per call, and a fresh `vec!` of that
/// size is zeroed and page-faulted (and unmapped again) every time. Reuse is safe without
/// clearing because the panel packers write every element of a panel (short panels and odd
/// `kc` are zero-filled first). Concurrent GEMMs find the pool empty and allocate their own;
/// the pool keeps the largest buffer returned.
pub(super) struct PackedB<E: Elem> {
    buf: Vec<E>,
    len: usize,
}

impl<E: Elem> PackedB<E> {
    fn take(len: usize) -> PackedB<E> {
        let mut buf = std::mem::take(&mut *E::pool().lock().unwrap_or_else(|e| e.into_inner()));
        if buf.len() < len {
            // Growing reallocates (and zeroes the new part) once; later calls reuse it.
            buf = vec![E::ZERO; len];
        }
        PackedB { buf, len }
    }
}

impl<E: Elem> Deref for PackedB<E> {
    type Target = [E];
    fn deref(&self) -> &[E] {
        &self.buf[..self.len]
    }
}

impl<E: Elem> Drop for PackedB<E> {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        let mut slot = E::pool().lock().unwrap_or_else(|e| e.into_inner());
        if slot.len() < buf.len() {
            *slot = buf;
        }
    }
}

/// Reads element `i` of a source slice as a packed element.
pub(super) trait Load<E>: Sync {
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
pub(super) fn pos<const DP: bool>(p: usize, x: usize, h: usize, w: usize) -> usize {
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
pub(super) fn pack_a_panel<E: Elem, S: Load<E> + ?Sized, const DP: bool>(
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
pub(super) fn pack_b_panel<E: Elem, S: Load<E> + ?Sized, const DP: bool>(
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
pub(super) fn k_blocks(k: usize) -> Vec<(usize, usize)> {
    (0..k).step_by(KC).map(|k0| (k0, KC.min(k - k0))).collect()
}

/// All of `B` packed: for each k block, `ceil(n/NR)` panels of `ceil(kc/2)·2·NR` elements,
/// each filled by `panel(k0, kc, j0, out)`.
pub(super) fn pack_b_all<E: Elem>(
    k: usize,
    n: usize,
    panel: impl Fn(usize, usize, usize, &mut [E]) + Sync,
) -> PackedB<E> {
    let panels = n.div_ceil(NR);
    let len = k.div_ceil(2) * 2 * panels * NR;
    let mut packed = PackedB::take(len);
    let mut rest = &mut packed.buf[..len];
    let mut blocks = Vec::new();
    for (k0, kc) in k_blocks(k) {
        let (blk, tail) = std::mem::take(&mut rest).split_at_mut(kc.div_ceil(2) * 2 * panels * NR);
        rest = tail;
        blocks.push((k0, kc, blk));
    }
    blocks.into_par_iter().for_each(|(k0, kc, blk)| {
        blk.par_chunks_mut(kc.div_ceil(2) * 2 * NR).enumerate().for_each(|(jr, out)| panel(k0, kc, jr * NR, out));
    });
    packed
}

/// [`pack_b_all`] with the generic panel packer.
pub(super) fn pack_b_generic<E: Elem, S: Load<E> + ?Sized, const DP: bool>(
    b: &S,
    trans: bool,
    k: usize,
    n: usize,
) -> PackedB<E> {
    pack_b_all(k, n, |k0, kc, j0, out| pack_b_panel::<E, S, DP>(b, trans, k, n, k0, kc, j0, out))
}
