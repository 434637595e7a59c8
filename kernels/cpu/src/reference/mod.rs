//! Naive, obviously-correct single-threaded reference ops: the oracle of the parity tests
//! (of this backend and of any other backend's parity suite).
//!
//! Everything computes in **f64** on plain slices with the layouts of [`megatron_core::Backend`]:
//! f32 results of a backend are compared against these with a stated tolerance, and the
//! finite-difference checks of every backward differentiate these forwards in f64.
//! Dropout masks come from the same [`crate::rng::DropoutMask`] (the mask *is* the spec).

mod activation;
mod attention;
mod attention_block;
mod cross_attention;
mod kv_cache;
mod loss;
mod norm;
mod optim;
mod padded_attention;

pub use activation::*;
pub use attention::*;
pub use attention_block::*;
pub use cross_attention::*;
pub use kv_cache::*;
pub use loss::*;
pub use norm::*;
pub use optim::*;
pub use padded_attention::*;

use crate::rng::DropoutMask;

/// f32 → f64 widening of a slice.
pub fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// `C = alpha·op(A)·op(B) + beta·C (+ bias on every row)`, the triple loop of [`megatron_core::GemmSpec`].
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: &[f64],
    trans_a: bool,
    b: &[f64],
    trans_b: bool,
    alpha: f64,
    beta: f64,
    c: &mut [f64],
    bias: Option<&[f64]>,
) {
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0;
            for p in 0..k {
                let av = if trans_a { a[p * m + i] } else { a[i * k + p] };
                let bv = if trans_b { b[j * k + p] } else { b[p * n + j] };
                s += av * bv;
            }
            let prev = if beta == 0.0 { 0.0 } else { beta * c[i * n + j] };
            c[i * n + j] = alpha * s + prev + bias.map_or(0.0, |b| b[j]);
        }
    }
}

/// Inverted dropout: element `i` is kept (and scaled by `1/(1-p)`) when the mask keeps it.
pub fn dropout(x: &mut [f64], p: f32, seed: u64) {
    if p == 0.0 {
        return;
    }
    let mask = DropoutMask::new(seed, p);
    for (i, v) in x.iter_mut().enumerate() {
        *v = if mask.keep(i as u64) { *v * mask.scale as f64 } else { 0.0 };
    }
}

/// `out[C] += Σ_rows x[N, C]`.
pub fn sum_rows(x: &[f64], c: usize, out: &mut [f64]) {
    for row in x.chunks_exact(c) {
        for (o, &v) in out.iter_mut().zip(row) {
            *o += v;
        }
    }
}
