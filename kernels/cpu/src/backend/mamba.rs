//! `impl MambaOps for CpuBackend`: the Mamba-2 mixer ops (`mamba/`).

use crate::CpuBackend;
use megatron_core::{DeviceTensor, MambaOps, Result};

impl MambaOps for CpuBackend {
    fn causal_conv1d_silu_forward(
        &self,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        bias: &DeviceTensor,
        out: &mut DeviceTensor,
        pre: &mut DeviceTensor,
        spec: megatron_core::Conv1dSpec,
    ) -> Result<()> {
        self.run(|| crate::mamba::conv::forward(x, weight, bias, out, pre, spec))
    }
    fn causal_conv1d_silu_backward(
        &self,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        pre: &DeviceTensor,
        d_out: &DeviceTensor,
        d_x: &mut DeviceTensor,
        d_weight: &mut DeviceTensor,
        d_bias: &mut DeviceTensor,
        spec: megatron_core::Conv1dSpec,
    ) -> Result<()> {
        self.run(|| crate::mamba::conv::backward(x, weight, pre, d_out, d_x, d_weight, d_bias, spec))
    }
    fn ssd_scan_forward(
        &self,
        inputs: megatron_core::SsdTensors,
        y: &mut DeviceTensor,
        states: &mut DeviceTensor,
        spec: megatron_core::SsdSpec,
    ) -> Result<()> {
        self.run(|| crate::mamba::ssd::forward(inputs, y, states, spec))
    }
    fn ssd_scan_backward(
        &self,
        inputs: megatron_core::SsdTensors,
        states: &DeviceTensor,
        dy: &DeviceTensor,
        grads: megatron_core::SsdGradTensors,
        spec: megatron_core::SsdSpec,
    ) -> Result<()> {
        self.run(|| crate::mamba::ssd_backward::backward(inputs, states, dy, grads, spec))
    }
    fn gated_rmsnorm_forward(
        &self,
        y: &DeviceTensor,
        z: &DeviceTensor,
        weight: &DeviceTensor,
        groups: usize,
        eps: f32,
        out: &mut DeviceTensor,
        rstd: &mut DeviceTensor,
    ) -> Result<()> {
        self.run(|| crate::mamba::gated_norm::forward(y, z, weight, groups, eps, out, rstd))
    }
    fn gated_rmsnorm_backward(
        &self,
        y: &DeviceTensor,
        z: &DeviceTensor,
        weight: &DeviceTensor,
        groups: usize,
        rstd: &DeviceTensor,
        d_out: &DeviceTensor,
        d_y: &mut DeviceTensor,
        d_z: &mut DeviceTensor,
        d_weight: &mut DeviceTensor,
    ) -> Result<()> {
        self.run(|| crate::mamba::gated_norm::backward(y, z, weight, groups, rstd, d_out, d_y, d_z, d_weight))
    }
}
