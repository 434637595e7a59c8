//! `impl MemoryOps for CpuBackend`: allocation, host transfer, `copy` and `cast`.

use crate::{memory, CpuBackend};
use megatron_core::{DType, DeviceTensor, HostBuffer, MemoryOps, Result};

impl MemoryOps for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }
    fn zeros(&self, shape: &[usize], dtype: DType) -> Result<DeviceTensor> {
        memory::zeros(shape, dtype)
    }
    fn from_host(&self, data: HostBuffer, shape: &[usize]) -> Result<DeviceTensor> {
        memory::from_host(data, shape)
    }
    fn to_host(&self, t: &DeviceTensor) -> Result<HostBuffer> {
        memory::to_host(t)
    }
    fn synchronize(&self) -> Result<()> {
        Ok(()) // every op has finished when it returns
    }
    fn copy(&self, src: &DeviceTensor, dst: &mut DeviceTensor) -> Result<()> {
        memory::copy(src, dst)
    }
    fn cast(&self, src: &DeviceTensor, dst: &mut DeviceTensor) -> Result<()> {
        self.run(|| memory::cast(src, dst))
    }
}
