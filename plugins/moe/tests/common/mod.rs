//! Shared helpers: a tiny MoE layer on the CPU backend and random host data.

#![allow(dead_code)]

use megatron_core::{Backend, DeviceTensor, HostBuffer, MlpEnv, ParallelContext};
use megatron_cpu::CpuBackend;
use megatron_moe::{MoeConfig, MoeLayer};
use std::sync::Arc;

pub const C: usize = 6;
pub const F: usize = 4;

pub fn backend() -> Arc<dyn Backend> {
    Arc::new(CpuBackend::with_threads(1).expect("cpu backend"))
}

/// Deterministic values in about [-scale, scale].
pub fn rand(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

pub fn tensor(b: &dyn Backend, v: Vec<f32>, shape: &[usize]) -> DeviceTensor {
    b.from_host(HostBuffer::F32(v), shape).expect("tensor")
}

pub fn config(json: serde_json::Value) -> MoeConfig {
    serde_json::from_value(json).expect("moe config")
}

pub fn env(backend: Arc<dyn Backend>, ctx: ParallelContext, swiglu: bool) -> MlpEnv {
    MlpEnv {
        backend,
        ctx,
        prefix: "decoder.layers.0.mlp".into(),
        layer_number: 0,
        num_layers: 1,
        hidden_size: C,
        ffn_hidden_size: F,
        swiglu,
        bias: false,
        init_method_std: 0.5,
        output_init_std: 0.5,
        seed: 7,
        sequence_parallel: false,
    }
}

pub fn layer(cfg: MoeConfig, ctx: ParallelContext, swiglu: bool) -> MoeLayer {
    MoeLayer::new(cfg, &env(backend(), ctx, swiglu)).expect("moe layer")
}
