//! Reference vocab-parallel embedding and cross entropy (SPEC §5.2/§5.4).

/// The local row/column of a global id on a rank owning `[start, start + len)`.
fn local(id: i32, start: usize, len: usize) -> Option<usize> {
    (id >= 0 && (id as usize) >= start && (id as usize) < start + len).then(|| id as usize - start)
}

/// `out[i] (+)= table[ids[i] - row_start]`, zero (or unchanged) for ids this rank lacks.
pub fn embedding_forward(ids: &[i32], table: &[f64], c: usize, row_start: usize, out: &mut [f64], accumulate: bool) {
    let rows = table.len() / c;
    for (i, &id) in ids.iter().enumerate() {
        for j in 0..c {
            let v = local(id, row_start, rows).map_or(0.0, |r| table[r * c + j]);
            out[i * c + j] = if accumulate { out[i * c + j] + v } else { v };
        }
    }
}

/// `d_table[ids[i] - row_start] += d_out[i]`.
pub fn embedding_backward(ids: &[i32], d_out: &[f64], c: usize, row_start: usize, d_table: &mut [f64]) {
    let rows = d_table.len() / c;
    for (i, &id) in ids.iter().enumerate() {
        if let Some(r) = local(id, row_start, rows) {
            for j in 0..c {
                d_table[r * c + j] += d_out[i * c + j];
            }
        }
    }
}

pub fn row_max(logits: &[f64], v: usize) -> Vec<f64> {
    logits.chunks_exact(v).map(|r| r.iter().cloned().fold(f64::NEG_INFINITY, f64::max)).collect()
}

/// `(sum_exp, target_logit)` of [`megatron_core::EmbeddingLossOps::cross_entropy_stats`].
pub fn cross_entropy_stats(
    logits: &[f64],
    targets: &[i32],
    v: usize,
    vocab_start: usize,
    row_max: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let mut se = Vec::new();
    let mut tl = Vec::new();
    for (i, row) in logits.chunks_exact(v).enumerate() {
        se.push(row.iter().map(|x| (x - row_max[i]).exp()).sum());
        tl.push(local(targets[i], vocab_start, v).map_or(0.0, |j| row[j] - row_max[i]));
    }
    (se, tl)
}

/// The full (single-rank) loss `Σ_i d_loss_i · (log Σ_j e^{l_ij} − l_{i,t_i})`.
pub fn cross_entropy_loss(logits: &[f64], targets: &[i32], v: usize, d_loss: &[f64]) -> f64 {
    let m = row_max(logits, v);
    let (se, tl) = cross_entropy_stats(logits, targets, v, 0, &m);
    (0..se.len()).map(|i| d_loss[i] * (se[i].ln() - tl[i])).sum()
}

/// `d_logits = (softmax − onehot(target)) · d_loss[i]`.
pub fn cross_entropy_backward(
    logits: &[f64],
    targets: &[i32],
    v: usize,
    vocab_start: usize,
    row_max: &[f64],
    sum_exp: &[f64],
    d_loss: &[f64],
) -> Vec<f64> {
    let mut d = Vec::with_capacity(logits.len());
    for (i, row) in logits.chunks_exact(v).enumerate() {
        let t = local(targets[i], vocab_start, v);
        for (j, &x) in row.iter().enumerate() {
            let onehot = if t == Some(j) { 1.0 } else { 0.0 };
            d.push(((x - row_max[i]).exp() / sum_exp[i] - onehot) * d_loss[i]);
        }
    }
    d
}
