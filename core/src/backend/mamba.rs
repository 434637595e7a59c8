//! [`MambaOps`]: the Mamba-2 mixer ops (see [`crate::mamba_ops`] for layouts and conventions).

use super::MemoryOps;
use crate::{DeviceTensor, Result};

/// Mamba-2 mixer ops. Backends without them keep the defaults, errors naming the backend.
pub trait MambaOps: MemoryOps {
    /// Causal depthwise conv1d + SiLU: overwrites `out` and `pre` (before the SiLU, kept for
    /// the backward). Backends without it keep this default, an error naming the backend.
    fn causal_conv1d_silu_forward(
        &self,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        bias: &DeviceTensor,
        out: &mut DeviceTensor,
        pre: &mut DeviceTensor,
        spec: crate::Conv1dSpec,
    ) -> Result<()> {
        let _ = (x, weight, bias, out, pre, spec);
        mamba_unsupported(self.name(), "causal_conv1d_silu_forward")
    }
    /// Overwrites `d_x`; accumulates `d_weight (Ch, K)` and `d_bias (Ch)`.
    #[allow(clippy::too_many_arguments)]
    fn causal_conv1d_silu_backward(
        &self,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        pre: &DeviceTensor,
        d_out: &DeviceTensor,
        d_x: &mut DeviceTensor,
        d_weight: &mut DeviceTensor,
        d_bias: &mut DeviceTensor,
        spec: crate::Conv1dSpec,
    ) -> Result<()> {
        let _ = (x, weight, pre, d_out, d_x, d_weight, d_bias, spec);
        mamba_unsupported(self.name(), "causal_conv1d_silu_backward")
    }
    /// The SSD chunked scan with the D skip: overwrites `y` and `states`.
    fn ssd_scan_forward(
        &self,
        inputs: crate::SsdTensors,
        y: &mut DeviceTensor,
        states: &mut DeviceTensor,
        spec: crate::SsdSpec,
    ) -> Result<()> {
        let _ = (inputs, y, states, spec);
        mamba_unsupported(self.name(), "ssd_scan_forward")
    }
    /// Overwrites every gradient in `grads` from `dy` and the forward's `states`.
    fn ssd_scan_backward(
        &self,
        inputs: crate::SsdTensors,
        states: &DeviceTensor,
        dy: &DeviceTensor,
        grads: crate::SsdGradTensors,
        spec: crate::SsdSpec,
    ) -> Result<()> {
        let _ = (inputs, states, dy, grads, spec);
        mamba_unsupported(self.name(), "ssd_scan_backward")
    }
    /// Gated RMSNorm per group (`norm_before_gate=False`): overwrites `out` and `rstd`.
    #[allow(clippy::too_many_arguments)]
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
        let _ = (y, z, weight, groups, eps, out, rstd);
        mamba_unsupported(self.name(), "gated_rmsnorm_forward")
    }
    /// Overwrites `d_y`, `d_z`; accumulates `d_weight`.
    #[allow(clippy::too_many_arguments)]
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
        let _ = (y, z, weight, groups, rstd, d_out, d_y, d_z, d_weight);
        mamba_unsupported(self.name(), "gated_rmsnorm_backward")
    }
}

fn mamba_unsupported(backend: &str, op: &str) -> Result<()> {
    anyhow::bail!("op `{op}` (Mamba-2 mixer) is not supported by backend `{backend}`; use the cpu backend")
}
