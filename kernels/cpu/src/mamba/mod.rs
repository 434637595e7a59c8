//! The Mamba-2 mixer's Backend ops on the CPU (layouts and conventions in
//! [`megatron_core::mamba_ops`]): [`conv`] (causal depthwise conv1d + SiLU), [`ssd`] and
//! [`ssd_backward`] (the SSD chunked scan, intra-chunk products as small GEMMs through
//! [`crate::tile::matmul`]), [`gated_norm`] (gated RMSNorm per group). fp32 only. The naive
//! references they are tested against live with the model (`megatron-hybrid`, `ops/`);
//! `cargo bench -p megatron-hybrid --bench mamba_ops` times both.

pub(crate) mod conv;
pub(crate) mod gated_norm;
pub(crate) mod ssd;
pub(crate) mod ssd_backward;
