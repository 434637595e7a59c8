//! The Mamba-2 mixer's numeric ops, each with its explicit backward and a naive reference:
//! [`conv`] (causal depthwise conv1d + SiLU), [`ssd`] (the chunked SSD scan), [`ssd_ref`] (the
//! sequential recurrence, the oracle of the scan), [`gated_norm`] (gated RMSNorm per group,
//! `norm_before_gate=False`) and [`dt`] (softplus of Δ, A = −exp(A_log)).
//!
//! They run on host `f32` slices (the CPU backend's storage; a GPU backend would implement
//! the same contracts as Backend ops, see the crate docs). Parallel work is split over
//! independent rows (batch × heads, batch × channels) and every shared gradient is summed in a
//! fixed order, so results do not depend on the thread count.

pub mod conv;
pub mod dt;
pub mod gated_norm;
pub mod ssd;
pub mod ssd_ref;

use anyhow::{bail, Result};

/// Sizes of one SSD scan: `H` heads of `P` channels, `G` groups of B/C with state size `N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SsdDims {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub groups: usize,
    pub state: usize,
    /// Steps per chunk (Megatron: 128); the sequential reference ignores it.
    pub chunk: usize,
}

pub(crate) fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        bail!("mamba op: `{what}` has {got} elements, expected {want}");
    }
    Ok(())
}

/// `x · sigmoid(x)`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `d silu(x) / dx = σ(x)(1 + x(1 − σ(x)))`.
pub fn silu_grad(x: f32) -> f32 {
    let s = 1.0 / (1.0 + (-x).exp());
    s * (1.0 + x * (1.0 - s))
}
