//! Reference activations: GeLU (tanh form), SwiGLU, row softmax, forward and backward.

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4; // sqrt(2/π)
const GELU_C: f64 = 0.044_715;

pub fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + GELU_C * x * x * x)).tanh())
}

/// `d gelu / dx`.
pub fn gelu_grad(x: f64) -> f64 {
    let t = (SQRT_2_OVER_PI * (x + GELU_C * x * x * x)).tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * x * x)
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `x [N, 2F] → [N, F] = silu(x[:, :F]) * x[:, F:]`.
pub fn swiglu_forward(x: &[f64], f: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len() / 2);
    for row in x.chunks_exact(2 * f) {
        for j in 0..f {
            let (a, b) = (row[j], row[f + j]);
            out.push(a * sigmoid(a) * b);
        }
    }
    out
}

pub fn swiglu_backward(x: &[f64], d_out: &[f64], f: usize) -> Vec<f64> {
    let mut dx = vec![0.0; x.len()];
    for (i, row) in x.chunks_exact(2 * f).enumerate() {
        for j in 0..f {
            let (a, b, g) = (row[j], row[f + j], d_out[i * f + j]);
            let s = sigmoid(a);
            dx[i * 2 * f + j] = g * b * (s + a * s * (1.0 - s));
            dx[i * 2 * f + f + j] = g * a * s;
        }
    }
    dx
}

pub fn softmax_forward(x: &[f64], c: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(c) {
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = row.iter().map(|&v| (v - m).exp()).sum();
        out.extend(row.iter().map(|&v| (v - m).exp() / z));
    }
    out
}

pub fn softmax_backward(y: &[f64], d_y: &[f64], c: usize) -> Vec<f64> {
    let mut dx = Vec::with_capacity(y.len());
    for (yr, dr) in y.chunks_exact(c).zip(d_y.chunks_exact(c)) {
        let d: f64 = yr.iter().zip(dr).map(|(a, b)| a * b).sum();
        dx.extend(yr.iter().zip(dr).map(|(&y, &g)| y * (g - d)));
    }
    dx
}
