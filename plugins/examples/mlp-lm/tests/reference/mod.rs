//! A naive f64 reference of the `swiglu-mlp-lm` forward pass (shared by the tests).
#![allow(dead_code)]

/// Parameters as f64 vectors, in `MlpLm::params()` order.
pub struct RefModel {
    pub layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub eps: f64,
    pub params: Vec<Vec<f64>>,
}

fn rmsnorm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let h = w.len();
    x.chunks(h)
        .flat_map(|row| {
            let r = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / h as f64 + eps).sqrt();
            row.iter().zip(w).map(move |(v, w)| v * r * w)
        })
        .collect()
}

/// `x (N, k) · W^T` with `W (n, k)`.
fn linear(x: &[f64], w: &[f64], k: usize) -> Vec<f64> {
    let n = w.len() / k;
    x.chunks(k).flat_map(|row| (0..n).map(move |j| (0..k).map(|c| row[c] * w[j * k + c]).sum::<f64>())).collect()
}

impl RefModel {
    /// Logits `(N, V)` of `tokens`.
    pub fn logits(&self, tokens: &[i32]) -> Vec<f64> {
        let (h, f) = (self.hidden, self.ffn);
        let p = &self.params;
        let mut x: Vec<f64> =
            tokens.iter().flat_map(|&t| p[0][t as usize * h..(t as usize + 1) * h].to_vec()).collect();
        for l in 0..self.layers {
            let n = rmsnorm(&x, &p[1 + 3 * l], self.eps);
            let u = linear(&n, &p[2 + 3 * l], h);
            let a: Vec<f64> = u
                .chunks(2 * f)
                .flat_map(|row| (0..f).map(move |j| row[j] / (1.0 + (-row[j]).exp()) * row[f + j]))
                .collect();
            let y = linear(&a, &p[3 + 3 * l], f);
            x.iter_mut().zip(&y).for_each(|(x, y)| *x += y);
        }
        let fnorm = rmsnorm(&x, &p[1 + 3 * self.layers], self.eps);
        linear(&fnorm, &p[2 + 3 * self.layers], h)
    }

    /// `Σ mask_i · (logsumexp(logits_i) - logits_i[label_i])`.
    pub fn loss(&self, tokens: &[i32], labels: &[i32], mask: &[f32]) -> f64 {
        let logits = self.logits(tokens);
        logits
            .chunks(self.vocab)
            .zip(labels.iter().zip(mask))
            .map(|(row, (&t, &m))| {
                let max = row.iter().cloned().fold(f64::MIN, f64::max);
                let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
                (lse - row[t as usize]) * m as f64
            })
            .sum()
    }
}
