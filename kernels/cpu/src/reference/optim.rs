//! Reference optimizer updates, written exactly as the formulas of [`megatron_core::AdamStep`]
//! and [`megatron_core::OptimizerOps::sgd_step`].

use megatron_core::AdamStep;

pub fn adam_step(p: &mut [f64], g: &[f64], m: &mut [f64], v: &mut [f64], s: AdamStep) {
    let (lr, b1, b2, eps, wd) = (s.lr as f64, s.beta1 as f64, s.beta2 as f64, s.eps as f64, s.weight_decay as f64);
    let t = s.step as i32;
    for i in 0..p.len() {
        p[i] -= lr * wd * p[i];
        m[i] = b1 * m[i] + (1.0 - b1) * g[i];
        v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
        let mhat = m[i] / (1.0 - b1.powi(t));
        let vhat = v[i] / (1.0 - b2.powi(t));
        p[i] -= lr * mhat / (vhat.sqrt() + eps);
    }
}

pub fn sgd_step(p: &mut [f64], g: &[f64], buf: &mut [f64], lr: f64, momentum: f64, wd: f64, first_step: bool) {
    for i in 0..p.len() {
        let gd = g[i] + wd * p[i];
        buf[i] = if first_step { gd } else { momentum * buf[i] + gd };
        p[i] -= lr * buf[i];
    }
}
