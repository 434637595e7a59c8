//! `impl GemmOps for CpuBackend`: GEMM (bf16 dot-product kernel when available) and grouped GEMM.

use crate::{gemm, CpuBackend};
use megatron_core::{DeviceTensor, GemmOps, GemmSpec, Result};

impl GemmOps for CpuBackend {
    fn gemm(
        &self,
        a: &DeviceTensor,
        b: &DeviceTensor,
        c: &mut DeviceTensor,
        spec: GemmSpec,
        bias: Option<&DeviceTensor>,
    ) -> Result<()> {
        let kernel = self.bf16_kernel();
        self.run(|| gemm::gemm_op(a, b, c, spec, bias, kernel))
    }
    fn grouped_gemm(
        &self,
        a: &DeviceTensor,
        b: &DeviceTensor,
        c: &mut DeviceTensor,
        groups: &[megatron_core::GemmGroup],
        spec: megatron_core::GroupedGemmSpec,
    ) -> Result<()> {
        self.run(|| crate::grouped_gemm::grouped_gemm_op(a, b, c, groups, spec))
    }
}
