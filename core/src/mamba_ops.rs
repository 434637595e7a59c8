//! Specs and tensor bundles of the Mamba-2 Backend ops ([`crate::MambaOps::causal_conv1d_silu_forward`],
//! [`crate::MambaOps::ssd_scan_forward`], [`crate::MambaOps::gated_rmsnorm_forward`] and their
//! backwards). The math (and the naive references the parity tests compare against) lives
//! with the model (`megatron-hybrid`, `ops/`); the CPU kernels in `megatron-cpu` (`mamba/`).
//!
//! All tensors of these ops are fp32 (the mixer runs in fp32); a backend rejects other
//! dtypes with an error naming the op. Layouts:
//! * conv: `x`, `out`, `pre` `(B, T, Ch)`, `weight (Ch, K)` (PyTorch's `[Ch, 1, K]`), `bias (Ch)`;
//!   `pre[t, c] = bias[c] + Σ_k w[c, k] x[t + k − (K−1), c]` (zero before the start),
//!   `out = silu(pre)`.
//! * scan: `x (B, T, H, P)`, `dt (B, T, H)` (Δ after softplus), `a (H)` (A < 0), `b`/`c`
//!   `(B, T, G, N)`, `d (H)`, `y (B, T, H, P)`, `states (B, H, nc, N, P)` (the state entering
//!   each of the `nc = ceil(T / chunk)` chunks, saved for the backward).
//! * gated norm: `y`, `z`, `out` `(R, D)`, `weight (D)`, `rstd (R, G)`;
//!   `out = rmsnorm_per_group(y ⊙ silu(z)) ⊙ weight`.
//!
//! Gradient conventions: activation gradients and the scan's `a`/`d` gradients are
//! overwritten; the conv's `d_weight`/`d_bias` and the norm's `d_weight` (parameters) are
//! accumulated (`+=`) like every other Backend op. Results must not depend on the thread count.

use crate::DeviceTensor;

/// Sizes of one SSD scan: `heads` heads of `head_dim` channels, `groups` groups of B/C with
/// `state` entries; `chunk` steps per chunk (Megatron: 128; the last chunk may be short).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SsdSpec {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub groups: usize,
    pub state: usize,
    pub chunk: usize,
}

impl SsdSpec {
    /// Elements of the saved `states (B, H, nc, N, P)`.
    pub fn states_len(&self) -> usize {
        self.batch * self.heads * self.seq.div_ceil(self.chunk.max(1)) * self.state * self.head_dim
    }
}

/// Sizes of one causal depthwise conv: `batch` rows of `seq` steps, `channels` channels,
/// kernel `width`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv1dSpec {
    pub batch: usize,
    pub seq: usize,
    pub channels: usize,
    pub width: usize,
}

/// The inputs of the scan (layouts in the module docs).
#[derive(Clone, Copy)]
pub struct SsdTensors<'a> {
    pub x: &'a DeviceTensor,
    pub dt: &'a DeviceTensor,
    pub a: &'a DeviceTensor,
    pub b: &'a DeviceTensor,
    pub c: &'a DeviceTensor,
    pub d: &'a DeviceTensor,
}

/// The gradients of every scan input (same layouts, all overwritten).
pub struct SsdGradTensors<'a> {
    pub x: &'a mut DeviceTensor,
    pub dt: &'a mut DeviceTensor,
    pub a: &'a mut DeviceTensor,
    pub b: &'a mut DeviceTensor,
    pub c: &'a mut DeviceTensor,
    pub d: &'a mut DeviceTensor,
}
