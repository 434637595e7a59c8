//! [`MemoryOps`]: a backend's name, allocation, host transfer, synchronisation, `copy` and
//! `cast`. The families with default methods build on it (the defaults name the backend in
//! their errors or fall back to host copies).

use crate::{DType, DeviceTensor, HostBuffer, Result};

/// Identity, allocation and data movement of a backend.
pub trait MemoryOps {
    /// Registered name (`cpu`, `cuda`).
    fn name(&self) -> &str;
    fn zeros(&self, shape: &[usize], dtype: DType) -> Result<DeviceTensor>;
    #[allow(clippy::wrong_self_convention)] // the name ARCHITECTURE.md gives the op
    fn from_host(&self, data: HostBuffer, shape: &[usize]) -> Result<DeviceTensor>;
    fn to_host(&self, t: &DeviceTensor) -> Result<HostBuffer>;
    fn synchronize(&self) -> Result<()>;
    /// `dst = src` (same shape and dtype).
    fn copy(&self, src: &DeviceTensor, dst: &mut DeviceTensor) -> Result<()>;
    /// `dst = cast(src)` between float dtypes (round to nearest even).
    fn cast(&self, src: &DeviceTensor, dst: &mut DeviceTensor) -> Result<()>;
}

/// `dst = src`, converting when the dtypes differ (e.g. an fp32 residual into a half buffer, or
/// an fp32-gathered bucket into a half parameter): `copy` for an equal dtype (equal shapes
/// checked), else `cast` (rounded once, to nearest even).
pub fn copy_any<B: MemoryOps + ?Sized>(backend: &B, src: &DeviceTensor, dst: &mut DeviceTensor) -> Result<()> {
    if src.dtype() == dst.dtype() {
        backend.copy(src, dst)
    } else {
        backend.cast(src, dst)
    }
}
