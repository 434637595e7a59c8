//! Conv1d+SiLU, gated RMSNorm and the Δ softplus: forward against naive references and
//! backward against central finite differences (f32, eps 1e-2, tolerance 2e-2 relative with
//! a floor of 0.05).

use megatron_hybrid::ops::conv::{
    conv_silu_backward, conv_silu_forward, conv_silu_reference, conv_silu_step, ConvDims,
};
use megatron_hybrid::ops::dt::{softplus_dt_backward, softplus_dt_forward};
use megatron_hybrid::ops::gated_norm::{gated_rmsnorm_backward, gated_rmsnorm_forward};
use megatron_hybrid::ops::silu;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn rand_vec(seed: u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(lo..hi)).collect()
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
}

/// Checks `analytic[i]` against the central difference of `f` in input element `i`.
fn fd(name: &str, x: &[f32], analytic: &[f32], f: &dyn Fn(&[f32]) -> f64) {
    let eps = 1e-2f32;
    let n = x.len();
    for i in [0, n / 5, n / 2, (4 * n) / 5, n - 1] {
        let mut p = x.to_vec();
        p[i] += eps;
        let plus = f(&p);
        p[i] -= 2.0 * eps;
        let minus = f(&p);
        let num = (plus - minus) / (2.0 * eps as f64);
        let a = analytic[i] as f64;
        let rel = (a - num).abs() / a.abs().max(num.abs()).max(0.05);
        assert!(rel < 2e-2, "{name}[{i}]: analytic {a} numeric {num} rel {rel}");
    }
}

#[test]
fn conv_forward_matches_reference_and_backward_matches_fd() {
    let d = ConvDims { batch: 2, seq: 9, channels: 5, width: 4 };
    let n = d.batch * d.seq * d.channels;
    let (x, w, b) = (rand_vec(1, n, -1.0, 1.0), rand_vec(2, 20, -0.5, 0.5), rand_vec(3, 5, -0.5, 0.5));
    let (out, pre) = conv_silu_forward(&d, &x, &w, &b).unwrap();
    let reference = conv_silu_reference(&d, &x, &w, &b);
    for (a, r) in out.iter().zip(&reference) {
        assert!((a - r).abs() < 1e-6, "{a} vs {r}");
    }
    let dy = rand_vec(4, n, -1.0, 1.0);
    let (dx, dw, db) = conv_silu_backward(&d, &x, &w, &pre, &dy).unwrap();
    let l = |x: &[f32], w: &[f32], b: &[f32]| dot(&conv_silu_forward(&d, x, w, b).unwrap().0, &dy);
    fd("conv dx", &x, &dx, &|v| l(v, &w, &b));
    fd("conv dw", &w, &dw, &|v| l(&x, v, &b));
    fd("conv dbias", &b, &db, &|v| l(&x, &w, v));
}

#[test]
fn conv_step_matches_the_full_convolution() {
    let d = ConvDims { batch: 2, seq: 6, channels: 3, width: 4 };
    let n = d.batch * d.seq * d.channels;
    let (x, w, b) = (rand_vec(5, n, -1.0, 1.0), rand_vec(6, 12, -0.5, 0.5), rand_vec(7, 3, -0.5, 0.5));
    let full = conv_silu_forward(&d, &x, &w, &b).unwrap().0;
    let mut state = vec![0.0f32; d.batch * (d.width - 1) * d.channels];
    for t in 0..d.seq {
        let xt: Vec<f32> = (0..d.batch).flat_map(|bi| x[(bi * d.seq + t) * 3..][..3].to_vec()).collect();
        let yt = conv_silu_step(3, 4, &mut state, &xt, &w, &b);
        for bi in 0..d.batch {
            for c in 0..3 {
                let want = full[(bi * d.seq + t) * 3 + c];
                assert!((yt[bi * 3 + c] - want).abs() < 1e-6);
            }
        }
    }
}

#[test]
fn gated_rmsnorm_matches_reference_and_fd() {
    let (rows, width, groups, eps) = (70, 8, 2, 1e-5);
    let y = rand_vec(8, rows * width, -1.0, 1.0);
    let z = rand_vec(9, rows * width, -2.0, 2.0);
    let w = rand_vec(10, width, 0.5, 1.5);
    let (out, rstd) = gated_rmsnorm_forward(&y, &z, &w, groups, eps).unwrap();
    // Reference: per row and group, in f64.
    for r in 0..rows {
        for g in 0..groups {
            let cols = g * 4..(g + 1) * 4;
            let gate: Vec<f64> = cols.clone().map(|j| (y[r * width + j] * silu(z[r * width + j])) as f64).collect();
            let ms = gate.iter().map(|v| v * v).sum::<f64>() / 4.0;
            for (k, j) in cols.enumerate() {
                let want = gate[k] / (ms + eps as f64).sqrt() * w[j] as f64;
                assert!((out[r * width + j] as f64 - want).abs() < 1e-5, "{} vs {want}", out[r * width + j]);
            }
        }
    }
    let d_out = rand_vec(11, rows * width, -1.0, 1.0);
    let (dy, dz, dw) = gated_rmsnorm_backward(&y, &z, &w, groups, &rstd, &d_out).unwrap();
    let l = |y: &[f32], z: &[f32], w: &[f32]| dot(&gated_rmsnorm_forward(y, z, w, groups, eps).unwrap().0, &d_out);
    fd("norm dy", &y, &dy, &|v| l(v, &z, &w));
    fd("norm dz", &z, &dz, &|v| l(&y, v, &w));
    fd("norm dw", &w, &dw, &|v| l(&y, &z, v));
}

#[test]
fn softplus_dt_backward_matches_fd() {
    let (dt, bias) = (rand_vec(12, 24, -3.0, 3.0), rand_vec(13, 4, -1.0, 1.0));
    let g = rand_vec(14, 24, -1.0, 1.0);
    let (d_dt, d_bias) = softplus_dt_backward(&dt, &bias, &g);
    fd("d dt", &dt, &d_dt, &|v| dot(&softplus_dt_forward(v, &bias), &g));
    fd("d dt_bias", &bias, &d_bias, &|v| dot(&softplus_dt_forward(&dt, v), &g));
}
