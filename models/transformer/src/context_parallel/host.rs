//! Host-side moves of the ring attention that keep the model's dtype: picking the K/V block
//! out of the fused qkv, slicing and writing back the rotary chunks. In bf16/fp16 the K/V
//! blocks travel around the CP ring as the half values the model holds (half the bytes of
//! fp32, and exact: widening them to fp32 for the block op loses nothing), as Megatron does.

use anyhow::{bail, Result};
use megatron_core::HostBuffer;
use std::ops::Range;

/// Applies `$body` to the float vector inside `$buf` (f32, bf16 or f16), rebuilding the same
/// variant from its result; other dtypes are an error naming `$what`.
macro_rules! map_float {
    ($buf:expr, $what:expr, |$v:ident| $body:expr) => {
        match $buf {
            HostBuffer::F32($v) => HostBuffer::F32($body),
            HostBuffer::BF16($v) => HostBuffer::BF16($body),
            HostBuffer::F16($v) => HostBuffer::F16($body),
            other => bail!("context-parallel {}: expected f32/bf16/f16 activations, got {}", $what, other.dtype()),
        }
    };
}

/// `buf[idx[0]], buf[idx[1]], ...` in `buf`'s dtype.
pub(super) fn pick(buf: &HostBuffer, idx: &[usize]) -> Result<HostBuffer> {
    Ok(map_float!(buf, "ring block", |v| idx.iter().map(|&i| v[i]).collect()))
}

/// `buf[range]` in `buf`'s dtype.
pub(super) fn slice(buf: &HostBuffer, range: Range<usize>) -> Result<HostBuffer> {
    Ok(map_float!(buf, "rotary chunk", |v| v[range].to_vec()))
}

/// Writes `src` (same dtype) into `buf` from `start`.
pub(super) fn write(buf: &mut HostBuffer, start: usize, src: &HostBuffer) -> Result<()> {
    match (buf, src) {
        (HostBuffer::F32(d), HostBuffer::F32(s)) => d[start..start + s.len()].copy_from_slice(s),
        (HostBuffer::BF16(d), HostBuffer::BF16(s)) => d[start..start + s.len()].copy_from_slice(s),
        (HostBuffer::F16(d), HostBuffer::F16(s)) => d[start..start + s.len()].copy_from_slice(s),
        (d, s) => bail!("context-parallel rotary chunk: cannot write {} values into {}", s.dtype(), d.dtype()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use megatron_core::DType;

    #[test]
    fn moves_keep_the_dtype_and_the_bits() {
        // Six bf16 values with distinct bit patterns (0x3f01, 0x3f02, ...).
        let bytes: Vec<u8> = (1u8..=6).flat_map(|i| [i, 0x3f]).collect();
        let buf = HostBuffer::from_le_bytes(DType::BF16, &bytes).unwrap();
        let p = pick(&buf, &[4, 1]).unwrap();
        assert_eq!(p.dtype(), DType::BF16);
        assert_eq!(p.to_le_bytes(), [5, 0x3f, 2, 0x3f]);
        let s = slice(&buf, 2..4).unwrap();
        let mut out = HostBuffer::zeros(DType::BF16, 5);
        write(&mut out, 1, &s).unwrap();
        assert_eq!(out.to_le_bytes(), [0, 0, 3, 0x3f, 4, 0x3f, 0, 0, 0, 0]);
        assert!(pick(&HostBuffer::I32(vec![1]), &[0]).is_err());
        assert!(write(&mut HostBuffer::F32(vec![0.0; 2]), 0, &s).is_err());
    }
}
