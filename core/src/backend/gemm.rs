//! [`GemmOps`]: the matmul ([`GemmSpec`]) and the grouped matmul of MoE experts.

use super::MemoryOps;
use crate::{DeviceTensor, Result};

/// `C[m,n] = alpha * op(A)[m,k] · op(B)[k,n] + beta * C (+ bias[n] on every row)`.
///
/// `A` is stored row-major as `[m,k]`, or `[k,m]` when `trans_a`; `B` as `[k,n]`, or `[n,k]`
/// when `trans_b` (the layout of a Linear weight `[out, in]`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmSpec {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    pub alpha: f32,
    pub beta: f32,
}

impl GemmSpec {
    /// `out[m,n] = x[m,k] · W[n,k]^T`, the forward of a Linear layer.
    pub fn linear(m: usize, n: usize, k: usize) -> GemmSpec {
        GemmSpec { m, n, k, trans_a: false, trans_b: true, alpha: 1.0, beta: 0.0 }
    }
}

/// Matrix multiplication.
pub trait GemmOps: MemoryOps {
    /// See [`GemmSpec`]. `bias` (length n) is added to every output row when given.
    fn gemm(
        &self,
        a: &DeviceTensor,
        b: &DeviceTensor,
        c: &mut DeviceTensor,
        spec: GemmSpec,
        bias: Option<&DeviceTensor>,
    ) -> Result<()>;
    /// Many independent f32 matmuls in one call (see [`crate::grouped_gemm::GemmGroup`]); `C`
    /// outside the groups' blocks is left as is. The default runs one [`GemmOps::gemm`] per
    /// group on host copies; backends override it with one parallel pass over all groups.
    fn grouped_gemm(
        &self,
        a: &DeviceTensor,
        b: &DeviceTensor,
        c: &mut DeviceTensor,
        groups: &[crate::grouped_gemm::GemmGroup],
        spec: crate::grouped_gemm::GroupedGemmSpec,
    ) -> Result<()> {
        crate::grouped_gemm::grouped_gemm_by_loop(self, a, b, c, groups, spec)
    }
}
