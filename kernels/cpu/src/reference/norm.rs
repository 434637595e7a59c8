//! Reference LayerNorm and RMSNorm over the last dim `c`, forward and backward.

/// Returns `(out, mean [N], rstd [N])`.
pub fn layernorm_forward(
    x: &[f64],
    w: &[f64],
    b: Option<&[f64]>,
    eps: f64,
    c: usize,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut out, mut mean, mut rstd) = (Vec::new(), Vec::new(), Vec::new());
    for row in x.chunks_exact(c) {
        let mu = row.iter().sum::<f64>() / c as f64;
        let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / c as f64;
        let rs = 1.0 / (var + eps).sqrt();
        for j in 0..c {
            out.push((row[j] - mu) * rs * w[j] + b.map_or(0.0, |b| b[j]));
        }
        mean.push(mu);
        rstd.push(rs);
    }
    (out, mean, rstd)
}

/// Returns `(d_x, d_weight, d_bias)` (the parameter gradients of this call alone).
pub fn layernorm_backward(d_out: &[f64], x: &[f64], w: &[f64], eps: f64, c: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (_, mean, rstd) = layernorm_forward(x, w, None, eps, c);
    let (mut dx, mut dw, mut db) = (vec![0.0; x.len()], vec![0.0; c], vec![0.0; c]);
    for (i, row) in x.chunks_exact(c).enumerate() {
        let dy = &d_out[i * c..(i + 1) * c];
        let xhat: Vec<f64> = row.iter().map(|v| (v - mean[i]) * rstd[i]).collect();
        let dxhat: Vec<f64> = (0..c).map(|j| dy[j] * w[j]).collect();
        let m1 = dxhat.iter().sum::<f64>() / c as f64;
        let m2 = dxhat.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / c as f64;
        for j in 0..c {
            dx[i * c + j] = rstd[i] * (dxhat[j] - m1 - xhat[j] * m2);
            dw[j] += dy[j] * xhat[j];
            db[j] += dy[j];
        }
    }
    (dx, dw, db)
}

/// Returns `(out, rstd [N])`.
pub fn rmsnorm_forward(x: &[f64], w: &[f64], eps: f64, c: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut out, mut rstd) = (Vec::new(), Vec::new());
    for row in x.chunks_exact(c) {
        let rs = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / c as f64 + eps).sqrt();
        out.extend(row.iter().zip(w).map(|(v, w)| v * rs * w));
        rstd.push(rs);
    }
    (out, rstd)
}

/// Returns `(d_x, d_weight)`.
pub fn rmsnorm_backward(d_out: &[f64], x: &[f64], w: &[f64], eps: f64, c: usize) -> (Vec<f64>, Vec<f64>) {
    let (_, rstd) = rmsnorm_forward(x, w, eps, c);
    let (mut dx, mut dw) = (vec![0.0; x.len()], vec![0.0; c]);
    for (i, row) in x.chunks_exact(c).enumerate() {
        let dy = &d_out[i * c..(i + 1) * c];
        let m = (0..c).map(|j| dy[j] * w[j] * row[j] * rstd[i]).sum::<f64>() / c as f64;
        for j in 0..c {
            let xhat = row[j] * rstd[i];
            dx[i * c + j] = rstd[i] * (dy[j] * w[j] - xhat * m);
            dw[j] += dy[j] * xhat;
        }
    }
    (dx, dw)
}
