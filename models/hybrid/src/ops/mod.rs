//! The Mamba-2 mixer's numeric ops, each with its explicit backward and a naive reference:
//! [`conv`] (causal depthwise conv1d + SiLU), [`ssd`] (the chunked SSD scan), [`ssd_ref`] (the
//! sequential recurrence, the oracle of the scan), [`gated_norm`] (gated RMSNorm per group,
//! `norm_before_gate=False`) and [`dt`] (softplus of Δ, A = −exp(A_log)).
//!
//! They run on host `f32` slices: the naive references of the Backend ops
//! ([`megatron_core::mamba_ops`]) that the mixer calls (fast CPU kernels in `megatron-cpu`,
//! `mamba/`; parity in `tests/fast_kernels.rs`, timing in `benches/mamba_ops.rs`). Parallel work is split over
//! independent rows (batch × heads, batch × channels) and every shared gradient is summed in a
//! fixed order, so results do not depend on the thread count.

pub mod conv;
pub mod dt;
pub mod gated_norm;
pub mod ssd;
pub mod ssd_ref;

use anyhow::{bail, Result};

/// Sizes of one SSD scan (the Backend op's [`megatron_core::SsdSpec`]): `H` heads of `P`
/// channels, `G` groups of B/C with state size `N`, `chunk` steps per chunk (the sequential
/// reference ignores it).
pub use megatron_core::SsdSpec as SsdDims;

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
