//! [`DeviceTensor`]: an owned, shaped, typed buffer that lives on some backend.
//!
//! Host (CPU) storage is a [`HostBuffer`]; device backends keep their memory behind
//! [`DeviceStorage`]. Code outside a backend moves data only through
//! [`crate::MemoryOps::to_host`] / [`crate::MemoryOps::from_host`].

use crate::DType;
use anyhow::{bail, Result};
use half::{bf16, f16};
use std::any::Any;

/// A typed host vector.
#[derive(Clone, Debug, PartialEq)]
pub enum HostBuffer {
    F32(Vec<f32>),
    BF16(Vec<bf16>),
    F16(Vec<f16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
    U16(Vec<u16>),
}

impl HostBuffer {
    pub fn zeros(dtype: DType, n: usize) -> HostBuffer {
        match dtype {
            DType::F32 => HostBuffer::F32(vec![0.0; n]),
            DType::BF16 => HostBuffer::BF16(vec![bf16::ZERO; n]),
            DType::F16 => HostBuffer::F16(vec![f16::ZERO; n]),
            DType::I32 => HostBuffer::I32(vec![0; n]),
            DType::I64 => HostBuffer::I64(vec![0; n]),
            DType::U8 => HostBuffer::U8(vec![0; n]),
            DType::U16 => HostBuffer::U16(vec![0; n]),
        }
    }

    pub fn dtype(&self) -> DType {
        match self {
            HostBuffer::F32(_) => DType::F32,
            HostBuffer::BF16(_) => DType::BF16,
            HostBuffer::F16(_) => DType::F16,
            HostBuffer::I32(_) => DType::I32,
            HostBuffer::I64(_) => DType::I64,
            HostBuffer::U8(_) => DType::U8,
            HostBuffer::U16(_) => DType::U16,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            HostBuffer::F32(v) => v.len(),
            HostBuffer::BF16(v) => v.len(),
            HostBuffer::F16(v) => v.len(),
            HostBuffer::I32(v) => v.len(),
            HostBuffer::I64(v) => v.len(),
            HostBuffer::U8(v) => v.len(),
            HostBuffer::U16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Values converted to f32 (floats by rounding rules of `half`, integers by `as`).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self {
            HostBuffer::F32(v) => v.clone(),
            HostBuffer::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            HostBuffer::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            HostBuffer::I32(v) => v.iter().map(|&x| x as f32).collect(),
            HostBuffer::I64(v) => v.iter().map(|&x| x as f32).collect(),
            HostBuffer::U8(v) => v.iter().map(|&x| x as f32).collect(),
            HostBuffer::U16(v) => v.iter().map(|&x| x as f32).collect(),
        }
    }

    /// Little-endian bytes (the safetensors payload layout).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        fn flat<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
            let mut out = Vec::with_capacity(v.len() * N);
            for &x in v {
                out.extend_from_slice(&f(x));
            }
            out
        }
        match self {
            HostBuffer::F32(v) => flat(v, f32::to_le_bytes),
            HostBuffer::BF16(v) => flat(v, bf16::to_le_bytes),
            HostBuffer::F16(v) => flat(v, f16::to_le_bytes),
            HostBuffer::I32(v) => flat(v, i32::to_le_bytes),
            HostBuffer::I64(v) => flat(v, i64::to_le_bytes),
            HostBuffer::U8(v) => v.clone(),
            HostBuffer::U16(v) => flat(v, u16::to_le_bytes),
        }
    }

    /// Parses little-endian bytes of `dtype`; the length must be a multiple of the item size.
    pub fn from_le_bytes(dtype: DType, bytes: &[u8]) -> Result<HostBuffer> {
        let size = dtype.size();
        if !bytes.len().is_multiple_of(size) {
            bail!("{} bytes is not a whole number of {dtype} elements ({size} bytes each)", bytes.len());
        }
        let chunks = bytes.chunks_exact(size);
        Ok(match dtype {
            DType::F32 => HostBuffer::F32(chunks.map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()),
            DType::BF16 => HostBuffer::BF16(chunks.map(|c| bf16::from_le_bytes([c[0], c[1]])).collect()),
            DType::F16 => HostBuffer::F16(chunks.map(|c| f16::from_le_bytes([c[0], c[1]])).collect()),
            DType::I32 => HostBuffer::I32(chunks.map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()),
            DType::I64 => HostBuffer::I64(
                chunks.map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect(),
            ),
            DType::U8 => HostBuffer::U8(bytes.to_vec()),
            DType::U16 => HostBuffer::U16(chunks.map(|c| u16::from_le_bytes([c[0], c[1]])).collect()),
        })
    }
}

/// Memory owned by a device backend (CUDA, ...). The backend downcasts through `as_any`.
pub trait DeviceStorage: Any + Send + Sync + std::fmt::Debug {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// Name of the backend that owns this memory (used in error messages).
    fn backend_name(&self) -> &str;
}

/// Where a tensor's elements live.
#[derive(Debug)]
pub enum Storage {
    Host(HostBuffer),
    Device(Box<dyn DeviceStorage>),
}

/// An owned, shaped, typed tensor. Row-major (C order) always.
#[derive(Debug)]
pub struct DeviceTensor {
    shape: Vec<usize>,
    dtype: DType,
    storage: Storage,
}

impl DeviceTensor {
    /// Wraps host memory; the buffer length must equal the product of `shape`.
    pub fn from_host_buffer(buf: HostBuffer, shape: &[usize]) -> Result<DeviceTensor> {
        let n: usize = shape.iter().product();
        if buf.len() != n {
            bail!("buffer of {} elements does not fit shape {:?} ({n} elements)", buf.len(), shape);
        }
        Ok(DeviceTensor { shape: shape.to_vec(), dtype: buf.dtype(), storage: Storage::Host(buf) })
    }

    /// Wraps device memory (for device backends).
    pub fn from_device_storage(storage: Box<dyn DeviceStorage>, shape: &[usize], dtype: DType) -> DeviceTensor {
        DeviceTensor { shape: shape.to_vec(), dtype, storage: Storage::Device(storage) }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    pub fn storage_mut(&mut self) -> &mut Storage {
        &mut self.storage
    }

    /// Changes the shape without touching the data (same element count required).
    pub fn reshape(&mut self, shape: &[usize]) -> Result<()> {
        let n: usize = shape.iter().product();
        if n != self.numel() {
            bail!("cannot reshape {:?} ({} elements) to {:?} ({n} elements)", self.shape, self.numel(), shape);
        }
        self.shape = shape.to_vec();
        Ok(())
    }

    /// Host f32 view; only for backends that keep memory on the host.
    pub fn host_f32(&self) -> Result<&[f32]> {
        match &self.storage {
            Storage::Host(HostBuffer::F32(v)) => Ok(v),
            Storage::Host(b) => bail!("expected an fp32 tensor, got {}", b.dtype()),
            Storage::Device(d) => bail!("tensor lives on backend `{}`, not on the host", d.backend_name()),
        }
    }

    /// Mutable host f32 view; only for backends that keep memory on the host.
    pub fn host_f32_mut(&mut self) -> Result<&mut [f32]> {
        match &mut self.storage {
            Storage::Host(HostBuffer::F32(v)) => Ok(v),
            Storage::Host(b) => bail!("expected an fp32 tensor, got {}", b.dtype()),
            Storage::Device(d) => bail!("tensor lives on backend `{}`, not on the host", d.backend_name()),
        }
    }

    /// Host i32 view (token ids); only for backends that keep memory on the host.
    pub fn host_i32(&self) -> Result<&[i32]> {
        match &self.storage {
            Storage::Host(HostBuffer::I32(v)) => Ok(v),
            Storage::Host(b) => bail!("expected an int32 tensor, got {}", b.dtype()),
            Storage::Device(d) => bail!("tensor lives on backend `{}`, not on the host", d.backend_name()),
        }
    }

    /// The host buffer, whatever its dtype; only for backends that keep memory on the host.
    pub fn host_buffer(&self) -> Result<&HostBuffer> {
        match &self.storage {
            Storage::Host(b) => Ok(b),
            Storage::Device(d) => bail!("tensor lives on backend `{}`, not on the host", d.backend_name()),
        }
    }

    pub fn host_buffer_mut(&mut self) -> Result<&mut HostBuffer> {
        match &mut self.storage {
            Storage::Host(b) => Ok(b),
            Storage::Device(d) => bail!("tensor lives on backend `{}`, not on the host", d.backend_name()),
        }
    }
}
