//! Helpers shared by this crate's integration tests: a CPU backend, deterministic random
//! tensors and `Σ out·R` probe losses (whose output gradient is `R`).

#![allow(dead_code)]

use megatron_core::{Backend, DeviceTensor, HostBuffer, ParallelContext};
use megatron_cpu::CpuBackend;
use megatron_transformer::ModuleBuilder;
use std::sync::Arc;

pub fn backend() -> Arc<dyn Backend> {
    Arc::new(CpuBackend::new())
}

pub fn builder(seed: u64) -> ModuleBuilder {
    ModuleBuilder::new(backend(), ParallelContext::single(), seed)
}

/// Deterministic values in `[-scale, scale)` (a small LCG: tests must not depend on rand).
pub fn random_vec(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

pub fn tensor(b: &dyn Backend, data: Vec<f32>, shape: &[usize]) -> DeviceTensor {
    b.from_host(HostBuffer::F32(data), shape).unwrap()
}

pub fn zeros(b: &dyn Backend, shape: &[usize]) -> DeviceTensor {
    b.zeros(shape, megatron_core::DType::F32).unwrap()
}

pub fn host(b: &dyn Backend, t: &DeviceTensor) -> Vec<f32> {
    b.to_host(t).unwrap().to_f32_vec()
}

/// `Σ out·r` in f64.
pub fn probe(b: &dyn Backend, out: &DeviceTensor, r: &[f32]) -> f64 {
    host(b, out).iter().zip(r).map(|(&o, &r)| o as f64 * r as f64).sum()
}

/// Central differences of `f` at `x` for the given element indices.
pub fn fd_input(x: &[f32], indices: &[usize], eps: f32, mut f: impl FnMut(&[f32]) -> f64) -> Vec<f64> {
    indices
        .iter()
        .map(|&i| {
            let mut v = x.to_vec();
            v[i] = x[i] + eps;
            let plus = f(&v);
            v[i] = x[i] - eps;
            let minus = f(&v);
            (plus - minus) / (2.0 * eps as f64)
        })
        .collect()
}

/// Asserts `|a - n| <= tol * max(|a|, |n|, floor)` for every pair, naming `what`.
pub fn assert_close(what: &str, analytic: &[f64], numeric: &[f64], tol: f64, floor: f64) {
    for (i, (a, n)) in analytic.iter().zip(numeric).enumerate() {
        let err = (a - n).abs() / a.abs().max(n.abs()).max(floor);
        assert!(err <= tol, "{what}[{i}]: analytic {a} vs finite difference {n} (rel err {err:.2e} > {tol:.0e})");
    }
}
