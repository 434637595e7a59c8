//! Bidirectional attention with a key-padding mask (`Backend::attention_padded_*`, see
//! [`megatron_core::padded_attention`]): row `b` is attention over its first `lengths[b]`
//! tokens only, so each row runs the tiled flash kernel of [`crate::attention`] (non-causal)
//! on its own real prefix, `(1, len, heads, 3, hd)`, and padded positions get zeros.
//!
//! Rows are independent tasks (rayon; the kernel parallelises over heads inside), each
//! producing its own output rows; they are written back in row order, so nothing depends on
//! scheduling. The prefix of row `b` is contiguous in every `(B, T, …)` tensor, so the only
//! extra work is copying it in and out: `O(T·C)` per row against the kernel's `O(T²·C)`.
//! Padded queries cost nothing (a BERT batch with short rows is cheaper than a full one).

use crate::attention;
use crate::check::{f32s, f32s_mut, i32s, numel};
use megatron_core::padded_attention::{padded_row_seed, validate_lengths};
use megatron_core::{AttentionSpec, DeviceTensor, HostBuffer, PaddedAttentionSpec, Result};
use rayon::prelude::*;

/// The dense spec of row `b` (length `len`).
fn row_spec(spec: &PaddedAttentionSpec, b: usize, len: usize) -> AttentionSpec {
    AttentionSpec {
        batch: 1,
        seq: len,
        heads: spec.heads,
        head_dim: spec.head_dim,
        causal: false,
        scale: spec.scale,
        dropout_p: spec.dropout_p,
        dropout_seed: padded_row_seed(spec.dropout_seed, b),
    }
}

/// A `(len, width)` host tensor copied from rows `[b·T, b·T + len)` of a `(B·T, width)` slice.
fn rows_of(x: &[f32], b: usize, t: usize, len: usize, width: usize) -> Result<DeviceTensor> {
    let start = b * t * width;
    DeviceTensor::from_host_buffer(HostBuffer::F32(x[start..start + len * width].to_vec()), &[1, len, width])
}

fn check_shapes(
    op: &str,
    s: &PaddedAttentionSpec,
    qkv: &DeviceTensor,
    out: &DeviceTensor,
    lse: &DeviceTensor,
) -> Result<()> {
    if s.heads == 0 || s.head_dim == 0 {
        megatron_core::anyhow::bail!("cpu backend: `{op}` needs heads and head_dim >= 1, got {s:?}");
    }
    if !s.scale.is_finite() {
        megatron_core::anyhow::bail!("cpu backend: `{op}` needs a finite scale, got {}", s.scale);
    }
    crate::check::in_range(op, "dropout_p", s.dropout_p, 0.0, 1.0)?;
    let qkv_shape = format!("(B={}, T={}, heads={}, 3, head_dim={})", s.batch, s.seq, s.heads, s.head_dim);
    numel(op, "qkv", qkv, s.batch * s.seq * s.heads * 3 * s.head_dim, &qkv_shape)?;
    numel(op, "out", out, s.batch * s.seq * s.heads * s.head_dim, "(B, T, heads*head_dim)")?;
    numel(op, "lse", lse, s.batch * s.heads * s.seq, "(B, heads, T)")
}

pub(crate) fn attention_padded_forward(
    qkv: &DeviceTensor,
    lengths: &DeviceTensor,
    out: &mut DeviceTensor,
    lse: &mut DeviceTensor,
    spec: PaddedAttentionSpec,
) -> Result<()> {
    const OP: &str = "attention_padded_forward";
    check_shapes(OP, &spec, qkv, out, lse)?;
    let lens = validate_lengths(OP, i32s(OP, "lengths", lengths)?, &spec)?;
    let (t, heads, hd) = (spec.seq, spec.heads, spec.head_dim);
    let x = f32s(OP, "qkv", qkv)?;
    // Per row: (out rows (len, heads·hd), lse (heads, len)) of its prefix.
    let rows: Vec<(Vec<f32>, Vec<f32>)> = lens
        .par_iter()
        .enumerate()
        .map(|(b, &len)| {
            if len == 0 {
                return Ok((Vec::new(), Vec::new()));
            }
            let q = rows_of(x, b, t, len, heads * 3 * hd)?;
            let mut o = DeviceTensor::from_host_buffer(
                HostBuffer::zeros(megatron_core::DType::F32, len * heads * hd),
                &[1, len, heads * hd],
            )?;
            let mut l = DeviceTensor::from_host_buffer(
                HostBuffer::zeros(megatron_core::DType::F32, heads * len),
                &[1, heads, len],
            )?;
            attention::attention_forward(&q, &mut o, &mut l, row_spec(&spec, b, len))?;
            Ok((o.host_f32()?.to_vec(), l.host_f32()?.to_vec()))
        })
        .collect::<Result<_>>()?;
    let ov = f32s_mut(OP, "out", out)?;
    ov.fill(0.0);
    let width = heads * hd;
    for (b, (o, _)) in rows.iter().enumerate() {
        ov[b * t * width..b * t * width + o.len()].copy_from_slice(o);
    }
    let lv = f32s_mut(OP, "lse", lse)?;
    lv.fill(0.0);
    for (b, (_, l)) in rows.iter().enumerate() {
        let len = lens[b];
        for h in 0..heads {
            let dst = (b * heads + h) * t;
            lv[dst..dst + len].copy_from_slice(&l[h * len..(h + 1) * len]);
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_padded_backward(
    d_out: &DeviceTensor,
    qkv: &DeviceTensor,
    lengths: &DeviceTensor,
    out: &DeviceTensor,
    lse: &DeviceTensor,
    d_qkv: &mut DeviceTensor,
    spec: PaddedAttentionSpec,
) -> Result<()> {
    const OP: &str = "attention_padded_backward";
    check_shapes(OP, &spec, qkv, out, lse)?;
    numel(OP, "d_out", d_out, out.numel(), "(B, T, heads*head_dim)")?;
    numel(OP, "d_qkv", d_qkv, qkv.numel(), "(B, T, heads, 3, head_dim)")?;
    let lens = validate_lengths(OP, i32s(OP, "lengths", lengths)?, &spec)?;
    let (t, heads, hd) = (spec.seq, spec.heads, spec.head_dim);
    let (x, o, dy, lv) =
        (f32s(OP, "qkv", qkv)?, f32s(OP, "out", out)?, f32s(OP, "d_out", d_out)?, f32s(OP, "lse", lse)?);
    let grads: Vec<Vec<f32>> = lens
        .par_iter()
        .enumerate()
        .map(|(b, &len)| {
            if len == 0 {
                return Ok(Vec::new());
            }
            let q = rows_of(x, b, t, len, heads * 3 * hd)?;
            let (o_b, dy_b) = (rows_of(o, b, t, len, heads * hd)?, rows_of(dy, b, t, len, heads * hd)?);
            let mut l = Vec::with_capacity(heads * len);
            for h in 0..heads {
                let src = (b * heads + h) * t;
                l.extend_from_slice(&lv[src..src + len]);
            }
            let l = DeviceTensor::from_host_buffer(HostBuffer::F32(l), &[1, heads, len])?;
            let mut g = DeviceTensor::from_host_buffer(
                HostBuffer::zeros(megatron_core::DType::F32, len * heads * 3 * hd),
                &[1, len, heads * 3 * hd],
            )?;
            attention::attention_backward(&dy_b, &q, &o_b, &l, &mut g, row_spec(&spec, b, len))?;
            Ok(g.host_f32()?.to_vec())
        })
        .collect::<Result<_>>()?;
    let dx = f32s_mut(OP, "d_qkv", d_qkv)?;
    dx.fill(0.0);
    let width = heads * 3 * hd;
    for (b, g) in grads.iter().enumerate() {
        dx[b * t * width..b * t * width + g.len()].copy_from_slice(g);
    }
    Ok(())
}
