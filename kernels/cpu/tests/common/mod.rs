//! Shared helpers of the parity tests: a seeded RNG, tensor constructors, tolerance checks and
//! central finite differences in f64.
#![allow(dead_code)] // each test binary uses a different subset

use megatron_core::{DType, DeviceTensor, HostBuffer, MemoryOps};
use megatron_cpu::CpuBackend;

/// A small deterministic RNG (splitmix64) so tests need no extra crates.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        megatron_cpu::rng::mix64(self.0)
    }
    /// Uniform in `[-1, 1)`.
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

pub fn backend() -> CpuBackend {
    CpuBackend::new()
}

pub fn tensor(be: &CpuBackend, data: &[f32], shape: &[usize]) -> DeviceTensor {
    be.from_host(HostBuffer::F32(data.to_vec()), shape).expect("test tensor")
}

pub fn ids(be: &CpuBackend, data: &[i32]) -> DeviceTensor {
    be.from_host(HostBuffer::I32(data.to_vec()), &[data.len()]).expect("test ids")
}

pub fn zeros(be: &CpuBackend, shape: &[usize]) -> DeviceTensor {
    be.zeros(shape, DType::F32).expect("test zeros")
}

pub fn host(be: &CpuBackend, t: &DeviceTensor) -> Vec<f32> {
    be.to_host(t).expect("to_host").to_f32_vec()
}

pub fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// Asserts `|got - want| <= atol + rtol·|want|` elementwise and reports the worst element.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], atol: f64, rtol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let excess = (g as f64 - w).abs() - (atol + rtol * w.abs());
        if excess > worst.1 || g.is_nan() {
            worst = (i, if g.is_nan() { f64::INFINITY } else { excess });
        }
    }
    assert!(
        worst.1 <= 0.0,
        "{what}: element {} got {} want {} (atol {atol}, rtol {rtol})",
        worst.0,
        got[worst.0],
        want[worst.0]
    );
}

/// Same check for two f64 vectors (reference backward vs finite differences).
pub fn assert_close64(what: &str, got: &[f64], want: &[f64], atol: f64, rtol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= atol + rtol * w.abs(), "{what}: element {i} got {g} want {w}");
    }
}

/// Central finite differences of a scalar f64 function: `(f(x+h e_i) - f(x-h e_i)) / 2h`.
pub fn finite_diff(x: &[f64], h: f64, f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let mut xp = x.to_vec();
    (0..x.len())
        .map(|i| {
            xp[i] = x[i] + h;
            let up = f(&xp);
            xp[i] = x[i] - h;
            let down = f(&xp);
            xp[i] = x[i];
            (up - down) / (2.0 * h)
        })
        .collect()
}

pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
