//! `CpuBackend` as a [`megatron_core::Backend`]: one file per op family trait, each
//! `impl <Family> for CpuBackend`; implementing every family makes it a `Backend`. Every op
//! validates through its module and runs inside this backend's rayon pool.

mod activation;
mod attention;
mod elementwise;
mod embedding_loss;
mod gemm;
mod kv_cache;
mod mamba;
mod memory;
mod norm;
mod optimizer;
mod padded_attention;
mod ring_attention;
mod rotary;
