//! The mixed-precision op boundary: bf16/fp16 arguments of the fp32 kernels are widened to f32
//! on the way in and rounded (once, to nearest even) into the caller's tensor on the way out.
//!
//! fp32 arguments pass through untouched (no copy), so the fp32 path costs nothing. The hot
//! elementwise ops and the GEMM convert inside their own chunked loops / packing instead
//! ([`crate::elementwise`], [`crate::gemm_half`]); the row ops (norms, softmax, attention,
//! cross-entropy, ...) come through here.

use crate::check::is_half;
use crate::gemm_half::{Dst, Src};
use megatron_core::half::{bf16, f16};
use megatron_core::{DType, DeviceTensor, HostBuffer, Result};
use rayon::prelude::*;
use std::ops::Deref;

/// Elements per parallel conversion task.
const CHUNK: usize = 1 << 15;

/// f32 copy of a bf16/fp16 tensor (same shape).
fn to_f32(t: &DeviceTensor) -> Result<DeviceTensor> {
    let mut out = vec![0.0f32; t.numel()];
    match t.host_buffer()? {
        HostBuffer::BF16(v) => out.par_chunks_mut(CHUNK).zip(v.par_chunks(CHUNK)).for_each(|(o, s)| widen_bf16(s, o)),
        HostBuffer::F16(v) => out.par_chunks_mut(CHUNK).zip(v.par_chunks(CHUNK)).for_each(|(o, s)| widen_f16(s, o)),
        other => unreachable!("to_f32 of a {} tensor", other.dtype()),
    }
    DeviceTensor::from_host_buffer(HostBuffer::F32(out), t.shape())
}

/// `dst = round(src)` for an f32 `src` and a bf16/fp16 `dst` of the same size.
fn store(src: &[f32], dst: &mut DeviceTensor) -> Result<()> {
    match dst.host_buffer_mut()? {
        HostBuffer::BF16(v) => v.par_chunks_mut(CHUNK).zip(src.par_chunks(CHUNK)).for_each(|(d, s)| narrow_bf16(s, d)),
        HostBuffer::F16(v) => v.par_chunks_mut(CHUNK).zip(src.par_chunks(CHUNK)).for_each(|(d, s)| narrow_f16(s, d)),
        other => unreachable!("store into a {} tensor", other.dtype()),
    }
    Ok(())
}

/// bf16 → f32 is a 16-bit shift; written on bits so the loop vectorises.
#[inline]
pub(crate) fn widen_bf16(s: &[bf16], o: &mut [f32]) {
    o.iter_mut().zip(s).for_each(|(o, &s)| *o = f32::from_bits((s.to_bits() as u32) << 16));
}

#[inline]
pub(crate) fn widen_f16(s: &[f16], o: &mut [f32]) {
    use megatron_core::half::slice::HalfFloatSliceExt;
    s.convert_to_f32_slice(o);
}

/// f32 → bf16, round to nearest even (`half`'s rounding, NaN kept a NaN).
#[inline]
pub(crate) fn narrow_bf16(s: &[f32], d: &mut [bf16]) {
    d.iter_mut().zip(s).for_each(|(d, &s)| *d = bf16::from_bits(bf16_bits(s)));
}

/// The bits of `x` rounded to bf16, to nearest even: exactly `half`'s `bf16::from_f32` (a
/// NaN stays a NaN with the quiet bit set), but branch-free so the loops that call it
/// vectorise (`half`'s version branches per element). Adding `0x7fff` plus the lowest kept
/// bit carries into bit 16 iff the dropped half is above the midpoint, or at it with an odd
/// kept part; finite values past the largest bf16 round to infinity, as in `half`.
#[inline(always)]
pub(crate) fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
    let nan = (b >> 16) | 0x40;
    (if b & 0x7fff_ffff > 0x7f80_0000 { nan } else { rounded }) as u16
}

#[inline]
pub(crate) fn narrow_f16(s: &[f32], d: &mut [f16]) {
    use megatron_core::half::slice::HalfFloatSliceExt;
    d.convert_from_f32_slice(s);
}

/// An input argument as fp32: borrowed when it already is, else a widened copy.
pub(crate) enum In<'a> {
    Ref(&'a DeviceTensor),
    Own(DeviceTensor),
}

impl Deref for In<'_> {
    type Target = DeviceTensor;
    fn deref(&self) -> &DeviceTensor {
        match self {
            In::Ref(t) => t,
            In::Own(t) => t,
        }
    }
}

/// Widens `t` when it is bf16/fp16; other dtypes pass through (the kernel reports them).
pub(crate) fn input(t: &DeviceTensor) -> Result<In<'_>> {
    Ok(if is_half(t) { In::Own(to_f32(t)?) } else { In::Ref(t) })
}

/// [`input`] for an optional argument.
pub(crate) fn input_opt(t: Option<&DeviceTensor>) -> Result<Option<In<'_>>> {
    t.map(input).transpose()
}

/// An output argument: the caller's tensor when fp32, else an f32 stand-in rounded back by
/// [`Out::finish`].
pub(crate) struct Out<'a> {
    dst: &'a mut DeviceTensor,
    tmp: Option<DeviceTensor>,
}

impl<'a> Out<'a> {
    /// `read`: the op reads the old contents (accumulates or updates in place), so the
    /// stand-in starts as their widened copy; otherwise it starts as zeros.
    pub(crate) fn new(dst: &'a mut DeviceTensor, read: bool) -> Result<Out<'a>> {
        let tmp = if !is_half(dst) {
            None
        } else if read {
            Some(to_f32(dst)?)
        } else {
            Some(DeviceTensor::from_host_buffer(HostBuffer::zeros(DType::F32, dst.numel()), dst.shape())?)
        };
        Ok(Out { dst, tmp })
    }

    pub(crate) fn t(&mut self) -> &mut DeviceTensor {
        match &mut self.tmp {
            Some(t) => t,
            None => self.dst,
        }
    }

    /// Rounds the stand-in into the caller's tensor.
    pub(crate) fn finish(self) -> Result<()> {
        if let Some(t) = &self.tmp {
            store(t.host_f32()?, self.dst)?;
        }
        Ok(())
    }
}

/// [`Out::new`] for an optional argument.
pub(crate) fn out_opt(t: Option<&mut DeviceTensor>, read: bool) -> Result<Option<Out<'_>>> {
    t.map(|t| Out::new(t, read)).transpose()
}

/// Per-thread buffers of [`chunked`]: one for the output chunk, one per input.
type Bufs = (Vec<f32>, Vec<Vec<f32>>);

/// Chunk `r` of `src` as f32: borrowed when fp32, else widened into `buf`.
pub(crate) fn chunk_f32<'b>(src: &'b Src, r: std::ops::Range<usize>, buf: &'b mut Vec<f32>) -> &'b [f32] {
    match src {
        Src::F32(x) => &x[r],
        Src::BF16(x) => {
            buf.resize(r.len(), 0.0);
            widen_bf16(&x[r], buf);
            buf
        }
        Src::F16(x) => {
            buf.resize(r.len(), 0.0);
            widen_f16(&x[r], buf);
            buf
        }
    }
}

/// Elementwise op with the widening fused into its chunks: `out` and every input (all of
/// `out`'s length) are cut into `chunk`-sized pieces; for each, half data are widened into
/// per-thread f32 buffers, `f(chunk_index, out_f32, inputs_f32)` runs, and a half `out` is
/// rounded back. fp32 data are used in place, so the fp32 path is unchanged and no full-size
/// temporary is made for any dtype. `read_out`: `f` reads `out`'s old values.
pub(crate) fn chunked(
    out: Dst,
    read_out: bool,
    ins: &[Src],
    chunk: usize,
    f: impl Fn(usize, &mut [f32], &[&[f32]]) + Sync + Send,
) {
    let init = || -> Bufs { (Vec::new(), vec![Vec::new(); ins.len()]) };
    let run = |bufs: &mut Bufs, ci: usize, len: usize, o: &mut [f32]| {
        let r = ci * chunk..ci * chunk + len;
        let views: Vec<&[f32]> = ins.iter().zip(bufs.1.iter_mut()).map(|(s, b)| chunk_f32(s, r.clone(), b)).collect();
        f(ci, o, &views);
    };
    match out {
        Dst::F32(o) => {
            o.par_chunks_mut(chunk).enumerate().for_each_init(init, |bufs, (ci, o)| run(bufs, ci, o.len(), o))
        }
        Dst::BF16(o) => o.par_chunks_mut(chunk).enumerate().for_each_init(init, |bufs, (ci, o)| {
            let mut ob = std::mem::take(&mut bufs.0);
            ob.resize(o.len(), 0.0);
            if read_out {
                widen_bf16(o, &mut ob);
            }
            run(bufs, ci, o.len(), &mut ob);
            narrow_bf16(&ob, o);
            bufs.0 = ob;
        }),
        Dst::F16(o) => o.par_chunks_mut(chunk).enumerate().for_each_init(init, |bufs, (ci, o)| {
            let mut ob = std::mem::take(&mut bufs.0);
            ob.resize(o.len(), 0.0);
            if read_out {
                widen_f16(o, &mut ob);
            }
            run(bufs, ci, o.len(), &mut ob);
            narrow_f16(&ob, o);
            bufs.0 = ob;
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`bf16_bits`] against `half` on every special value and on random bit patterns.
    #[test]
    fn bf16_bits_equals_half() {
        let mut specials = vec![0u32, 0x8000_0000, 0x7f80_0000, 0xff80_0000, 0x7fc0_0000, 0x7f80_0001, 0xffff_ffff];
        specials.extend([0x7f7f_ffff, 0xff7f_ffff, 0x0000_0001, 0x0000_8000, 0x0001_8000, 0x3f80_8000, 0x3f81_8000]);
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let random = (0..2_000_000).map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 16) as u32
        });
        for b in specials.into_iter().chain(random) {
            let x = f32::from_bits(b);
            assert_eq!(bf16_bits(x), bf16::from_f32(x).to_bits(), "bits {b:#010x}");
        }
    }
}
