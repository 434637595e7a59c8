//! Allocation, host transfer, copy and dtype casts. These are the only ops that handle every
//! [`DType`]; floats convert with `half`'s round-to-nearest-even.

use crate::widen::{narrow_bf16, narrow_f16, widen_bf16, widen_f16};
use megatron_core::anyhow::bail;
use megatron_core::half::{bf16, f16};
use megatron_core::{DType, DeviceTensor, HostBuffer, Result, Storage};
use rayon::prelude::*;

/// Elements per parallel cast task.
const CHUNK: usize = 1 << 15;

fn host<'a>(op: &str, arg: &str, t: &'a DeviceTensor) -> Result<&'a HostBuffer> {
    match t.storage() {
        Storage::Host(b) => Ok(b),
        Storage::Device(d) => bail!(
            "cpu backend: `{op}` argument `{arg}` lives on backend `{}`; move it with that backend's to_host",
            d.backend_name()
        ),
    }
}

pub(crate) fn zeros(shape: &[usize], dtype: DType) -> Result<DeviceTensor> {
    let n = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    let Some(n) = n else { bail!("cpu backend: `zeros` shape {shape:?} has more elements than fit in memory") };
    DeviceTensor::from_host_buffer(HostBuffer::zeros(dtype, n), shape)
}

pub(crate) fn from_host(data: HostBuffer, shape: &[usize]) -> Result<DeviceTensor> {
    let n: usize = shape.iter().product();
    if data.len() != n {
        bail!(
            "cpu backend: `from_host` got {} elements of {} for shape {shape:?}, which needs {n}",
            data.len(),
            data.dtype()
        );
    }
    DeviceTensor::from_host_buffer(data, shape)
}

pub(crate) fn to_host(t: &DeviceTensor) -> Result<HostBuffer> {
    Ok(host("to_host", "t", t)?.clone())
}

pub(crate) fn copy(src: &DeviceTensor, dst: &mut DeviceTensor) -> Result<()> {
    if src.dtype() != dst.dtype() || src.shape() != dst.shape() {
        bail!(
            "cpu backend: `copy` needs equal shape and dtype, got src {:?} {} and dst {:?} {} (use `cast` to convert)",
            src.shape(),
            src.dtype(),
            dst.shape(),
            dst.dtype()
        );
    }
    let s = host("copy", "src", src)?.clone();
    let d = dst.host_buffer_mut()?;
    *d = s;
    Ok(())
}

/// Values of a float/int buffer as f32 (ints by `as`, which is exact below 2^24).
fn as_f32(b: &HostBuffer) -> Vec<f32> {
    b.to_f32_vec()
}

pub(crate) fn cast(src: &DeviceTensor, dst: &mut DeviceTensor) -> Result<()> {
    if src.numel() != dst.numel() {
        bail!(
            "cpu backend: `cast` needs the same number of elements, got src {:?} and dst {:?}",
            src.shape(),
            dst.shape()
        );
    }
    let s = host("cast", "src", src)?;
    let to = dst.dtype();
    if s.dtype() == to {
        *dst.host_buffer_mut()? = s.clone();
        return Ok(());
    }
    if !to.is_float() {
        bail!(
            "cpu backend: `cast` from {} to {to} is not supported: only float destinations (fp32, bf16, fp16) \
             or an identical dtype",
            s.dtype()
        );
    }
    // The float <-> float casts of mixed precision (main params <-> model params, every step)
    // run in parallel chunks, writing into the existing destination buffer.
    match (s, dst.host_buffer_mut()?) {
        (HostBuffer::F32(v), HostBuffer::BF16(d)) => {
            d.par_chunks_mut(CHUNK).zip(v.par_chunks(CHUNK)).for_each(|(d, s)| narrow_bf16(s, d));
            return Ok(());
        }
        (HostBuffer::F32(v), HostBuffer::F16(d)) => {
            d.par_chunks_mut(CHUNK).zip(v.par_chunks(CHUNK)).for_each(|(d, s)| narrow_f16(s, d));
            return Ok(());
        }
        (HostBuffer::BF16(v), HostBuffer::F32(d)) => {
            d.par_chunks_mut(CHUNK).zip(v.par_chunks(CHUNK)).for_each(|(d, s)| widen_bf16(s, d));
            return Ok(());
        }
        (HostBuffer::F16(v), HostBuffer::F32(d)) => {
            d.par_chunks_mut(CHUNK).zip(v.par_chunks(CHUNK)).for_each(|(d, s)| widen_f16(s, d));
            return Ok(());
        }
        _ => {}
    }
    let out = match (s, to) {
        // Direct paths keep bf16/f16 -> f32 exact and f32 -> bf16/f16 a single rounding.
        (HostBuffer::F32(v), DType::BF16) => HostBuffer::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
        (HostBuffer::F32(v), DType::F16) => HostBuffer::F16(v.iter().map(|&x| f16::from_f32(x)).collect()),
        (other, DType::F32) => HostBuffer::F32(as_f32(other)),
        // bf16 <-> f16 and int -> half go through f32 (exact widening, then one rounding).
        (other, DType::BF16) => HostBuffer::BF16(as_f32(other).into_iter().map(bf16::from_f32).collect()),
        (other, DType::F16) => HostBuffer::F16(as_f32(other).into_iter().map(f16::from_f32).collect()),
        _ => unreachable!("non-float destinations were rejected above"),
    };
    *dst.host_buffer_mut()? = out;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cast_rounds_to_nearest_even_and_round_trips() {
        let src = from_host(HostBuffer::F32(vec![1.0, 1.0 + 1.0 / 256.0, -2.5, 3.0e5]), &[4]).unwrap();
        let mut b = zeros(&[4], DType::BF16).unwrap();
        cast(&src, &mut b).unwrap();
        // 1 + 2^-8 is exactly half way between two bf16 values: ties go to the even one (1.0).
        let HostBuffer::BF16(v) = to_host(&b).unwrap() else { panic!("not bf16") };
        assert_eq!(v[1].to_f32(), 1.0);
        let mut back = zeros(&[2, 2], DType::F32).unwrap();
        cast(&b, &mut back).unwrap();
        assert_eq!(to_host(&back).unwrap().to_f32_vec()[2], -2.5);
        let mut h = zeros(&[4], DType::F16).unwrap();
        cast(&b, &mut h).unwrap();
        assert_eq!(to_host(&h).unwrap().to_f32_vec()[0], 1.0);
        let mut i = zeros(&[4], DType::I32).unwrap();
        assert!(cast(&src, &mut i).is_err());
        let mut wrong = zeros(&[3], DType::F32).unwrap();
        assert!(copy(&src, &mut wrong).is_err());
        assert!(from_host(HostBuffer::U8(vec![1, 2]), &[3]).is_err());
    }
}
