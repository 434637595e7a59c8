//! Δ and A of the mixer: `Δ = softplus(dt + dt_bias)` (PyTorch's softplus: identity above 20)
//! and `A = −exp(A_log)`, with their backward.

/// `Δ (R, H)` from the raw `dt (R, H)` and `dt_bias (H)`.
pub fn softplus_dt_forward(dt: &[f32], bias: &[f32]) -> Vec<f32> {
    let h = bias.len().max(1);
    dt.iter().enumerate().map(|(i, &v)| softplus(v + bias[i % h])).collect()
}

/// `(d dt (R, H), d dt_bias (H))` from `dΔ`; the bias gradient sums rows in order.
pub fn softplus_dt_backward(dt: &[f32], bias: &[f32], d_delta: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let h = bias.len().max(1);
    let d_dt: Vec<f32> = dt.iter().zip(d_delta).enumerate().map(|(i, (&v, g))| g * sigmoid(v + bias[i % h])).collect();
    let mut d_bias = vec![0.0f32; bias.len()];
    for (i, g) in d_dt.iter().enumerate() {
        d_bias[i % h] += g;
    }
    (d_dt, d_bias)
}

pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `A = −exp(A_log)`.
pub fn a_from_log(a_log: &[f32]) -> Vec<f32> {
    a_log.iter().map(|v| -v.exp()).collect()
}

/// `d A_log = dA · A` (since `dA/dA_log = −exp(A_log) = A`).
pub fn a_log_backward(a_log: &[f32], d_a: &[f32]) -> Vec<f32> {
    a_log.iter().zip(d_a).map(|(v, g)| g * -v.exp()).collect()
}

/// Inverse softplus (`x + log(−expm1(−x))`), Megatron's `dt_bias` init of a drawn Δ.
pub fn inverse_softplus(x: f32) -> f32 {
    x + (-(-x).exp_m1()).ln()
}
