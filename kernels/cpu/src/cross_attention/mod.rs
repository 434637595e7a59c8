//! Tiled online-softmax cross-attention ([`megatron_core::CrossAttentionSpec`]): queries of
//! length `Tq` against keys/values of length `Tk`, valid lengths on both sides, an optional
//! causal mask and an optional additive `(heads, Tq, Tk)` bias (T5's relative positions),
//! forward and backward side by side.
//!
//! The same scheme as the self-attention kernel (`crate::attention`): forward keeps only `out`
//! and `lse`; backward recomputes every `(keys, queries)` score tile from the packed q/k, the
//! bias and `lse`. One rayon task per (batch, head) owns that head's rows of every output;
//! when the bias gradient is wanted, one task per head walks the batch in order instead, so
//! `d_bias` is summed over the batch in a fixed order (no result depends on the thread count).
//! Padded queries and keys are cut off before the tile loops (a row's valid prefix only), so
//! padding costs no work.
//!
//! Memory: forward packs K and V of one head (`2·Tk·hd` floats) plus one tile set; backward
//! ≈ `4·(Tq + Tk)·hd` floats per running task. The score matrix is never materialised.
//!
//! Layout: this file holds the op entry points (validation, scheduling); `forward.rs` and
//! `backward.rs` the per-head kernels.

use crate::check::{f32s, f32s_mut, i32s, in_range, numel};
use crate::rng::DropoutMask;
use crate::scratch::RowWriter;
use megatron_core::anyhow::bail;
use megatron_core::{CrossAttentionSpec, DeviceTensor, Result};
use rayon::prelude::*;

mod backward;
mod forward;

pub(crate) use crate::attention::TILE;

/// Offsets into the `q`/`out` `(B, Tq, heads, hd)` and `kv` `(B, Tk, heads, 2, hd)` layouts.
#[derive(Clone, Copy)]
pub(super) struct Layout {
    pub tq: usize,
    pub tk: usize,
    pub heads: usize,
    pub hd: usize,
    /// Row stride of q/out: `heads*hd`.
    pub rs_q: usize,
    /// Row stride of kv: `heads*2*hd`.
    pub rs_kv: usize,
}

impl Layout {
    fn new(s: &CrossAttentionSpec) -> Layout {
        Layout {
            tq: s.q_len,
            tk: s.kv_len,
            heads: s.heads,
            hd: s.head_dim,
            rs_q: s.heads * s.head_dim,
            rs_kv: s.heads * 2 * s.head_dim,
        }
    }
    /// Offset of query (or output) row `i` of head `h`.
    pub(super) fn q(&self, b: usize, i: usize, h: usize) -> usize {
        (b * self.tq + i) * self.rs_q + h * self.hd
    }
    /// Offset of the k (`slot` 0) or v (1) row of key `j` of head `h`.
    pub(super) fn kv(&self, b: usize, j: usize, h: usize, slot: usize) -> usize {
        (b * self.tk + j) * self.rs_kv + (2 * h + slot) * self.hd
    }
    fn mask_index(&self, b: usize, h: usize, i: usize, j: usize) -> u64 {
        (((b * self.heads + h) * self.tq + i) * self.tk + j) as u64
    }
}

/// What one (batch, head) task reads besides the tensors.
pub(super) struct Head<'a> {
    pub l: Layout,
    pub spec: &'a CrossAttentionSpec,
    pub b: usize,
    pub h: usize,
    /// Valid queries and keys of row `b`.
    pub qv: usize,
    pub kvn: usize,
    /// `(Tq, Tk)` bias of head `h`, when given.
    pub bias: Option<&'a [f32]>,
}

impl Head<'_> {
    /// Adds the bias to a transposed score tile `S^T (kn, qn)` (row stride `ld`).
    #[inline(always)]
    pub(super) fn add_bias(&self, st: &mut [f32], kn: usize, qn: usize, ld: usize, ks: usize, qs: usize) {
        if let Some(bias) = self.bias {
            let tk = self.l.tk;
            for (c, row) in st.chunks_mut(ld).take(kn).enumerate() {
                for (r, v) in row[..qn].iter_mut().enumerate() {
                    *v += bias[(qs + r) * tk + ks + c];
                }
            }
        }
    }

    /// Multiplies a probability tile `P^T (kn, qn)` (row stride `ld`) by its dropout factors.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dropout(
        &self,
        pt: &mut [f32],
        kn: usize,
        qn: usize,
        ld: usize,
        mask: &DropoutMask,
        ks: usize,
        qs: usize,
    ) {
        for (c, row) in pt.chunks_mut(ld).take(kn).enumerate() {
            for (r, v) in row[..qn].iter_mut().enumerate() {
                *v *= mask.factor(self.l.mask_index(self.b, self.h, qs + r, ks + c));
            }
        }
    }
}

fn validate(op: &str, s: &CrossAttentionSpec) -> Result<()> {
    if s.head_dim == 0 || s.heads == 0 {
        bail!("cpu backend: `{op}` needs heads and head_dim >= 1, got {s:?}");
    }
    if !s.scale.is_finite() {
        bail!("cpu backend: `{op}` needs a finite scale, got {}", s.scale);
    }
    in_range(op, "dropout_p", s.dropout_p, 0.0, 1.0)
}

/// The valid lengths of `arg` (int32 `[B]`, each in `0..=len`), or `len` for every row.
fn lengths(op: &str, arg: &str, t: Option<&DeviceTensor>, batch: usize, len: usize) -> Result<Vec<usize>> {
    let Some(t) = t else { return Ok(vec![len; batch]) };
    numel(op, arg, t, batch, "one int32 valid length per batch row [B]")?;
    i32s(op, arg, t)?
        .iter()
        .enumerate()
        .map(|(b, &v)| {
            if v < 0 || v as usize > len {
                bail!("cpu backend: `{op}` argument `{arg}`[{b}] = {v} is outside 0..={len} (a valid length)");
            }
            Ok(v as usize)
        })
        .collect()
}

/// Shape checks shared by forward and backward; returns the valid lengths.
#[allow(clippy::too_many_arguments)]
fn check_args(
    op: &str,
    s: &CrossAttentionSpec,
    q: &DeviceTensor,
    kv: &DeviceTensor,
    q_valid: Option<&DeviceTensor>,
    kv_valid: Option<&DeviceTensor>,
    bias: Option<&DeviceTensor>,
    lse: &DeviceTensor,
) -> Result<(Vec<usize>, Vec<usize>)> {
    validate(op, s)?;
    let shape_q = format!("q (B={}, Tq={}, heads={}, head_dim={})", s.batch, s.q_len, s.heads, s.head_dim);
    numel(op, "q", q, s.q_numel(), &shape_q)?;
    let shape_kv = format!("kv (B={}, Tk={}, heads={}, 2, head_dim={})", s.batch, s.kv_len, s.heads, s.head_dim);
    numel(op, "kv", kv, s.kv_numel(), &shape_kv)?;
    numel(op, "lse", lse, s.lse_numel(), "(B, heads, Tq)")?;
    if let Some(bias) = bias {
        numel(op, "bias", bias, s.bias_numel(), "(heads, Tq, Tk)")?;
    }
    Ok((lengths(op, "q_valid", q_valid, s.batch, s.q_len)?, lengths(op, "kv_valid", kv_valid, s.batch, s.kv_len)?))
}

fn head<'a>(
    s: &'a CrossAttentionSpec,
    bias: Option<&'a [f32]>,
    qv: &[usize],
    kvv: &[usize],
    b: usize,
    h: usize,
) -> Head<'a> {
    let per_head = s.q_len * s.kv_len;
    Head {
        l: Layout::new(s),
        spec: s,
        b,
        h,
        qv: qv[b],
        kvn: kvv[b],
        bias: bias.map(|t| &t[h * per_head..(h + 1) * per_head]),
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn cross_attention_forward(
    q: &DeviceTensor,
    kv: &DeviceTensor,
    q_valid: Option<&DeviceTensor>,
    kv_valid: Option<&DeviceTensor>,
    bias: Option<&DeviceTensor>,
    out: &mut DeviceTensor,
    lse: &mut DeviceTensor,
    s: CrossAttentionSpec,
) -> Result<()> {
    const OP: &str = "cross_attention_forward";
    let (qv, kvv) = check_args(OP, &s, q, kv, q_valid, kv_valid, bias, lse)?;
    numel(OP, "out", out, s.q_numel(), "(B, Tq, heads*head_dim)")?;
    if s.q_len == 0 || s.batch == 0 {
        return Ok(());
    }
    let (qx, kvx) = (f32s(OP, "q", q)?, f32s(OP, "kv", kv)?);
    let bias = bias.map(|t| f32s(OP, "bias", t)).transpose()?;
    let lv = f32s_mut(OP, "lse", lse)?;
    let o = RowWriter::new(f32s_mut(OP, "out", out)?);
    // One task per (b, h): its lse is a contiguous chunk, its output rows are disjoint.
    lv.par_chunks_mut(s.q_len).enumerate().for_each(|(bh, head_lse)| {
        let hd = head(&s, bias, &qv, &kvv, bh / s.heads, bh % s.heads);
        forward::forward_head(qx, kvx, &hd, &o, head_lse)
    });
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn cross_attention_backward(
    d_out: &DeviceTensor,
    q: &DeviceTensor,
    kv: &DeviceTensor,
    q_valid: Option<&DeviceTensor>,
    kv_valid: Option<&DeviceTensor>,
    bias: Option<&DeviceTensor>,
    out: &DeviceTensor,
    lse: &DeviceTensor,
    d_q: &mut DeviceTensor,
    d_kv: &mut DeviceTensor,
    d_bias: Option<&mut DeviceTensor>,
    s: CrossAttentionSpec,
) -> Result<()> {
    const OP: &str = "cross_attention_backward";
    let (qv, kvv) = check_args(OP, &s, q, kv, q_valid, kv_valid, bias, lse)?;
    numel(OP, "out", out, s.q_numel(), "(B, Tq, heads*head_dim)")?;
    numel(OP, "d_out", d_out, s.q_numel(), "(B, Tq, heads*head_dim)")?;
    numel(OP, "d_q", d_q, s.q_numel(), "(B, Tq, heads, head_dim)")?;
    numel(OP, "d_kv", d_kv, s.kv_numel(), "(B, Tk, heads, 2, head_dim)")?;
    if let Some(db) = d_bias.as_deref() {
        numel(OP, "d_bias", db, s.bias_numel(), "(heads, Tq, Tk)")?;
    }
    if s.batch == 0 {
        return Ok(());
    }
    let (qx, kvx) = (f32s(OP, "q", q)?, f32s(OP, "kv", kv)?);
    let (o, dy, lv) = (f32s(OP, "out", out)?, f32s(OP, "d_out", d_out)?, f32s(OP, "lse", lse)?);
    let bias = bias.map(|t| f32s(OP, "bias", t)).transpose()?;
    let dq = RowWriter::new(f32s_mut(OP, "d_q", d_q)?);
    let dkv = RowWriter::new(f32s_mut(OP, "d_kv", d_kv)?);
    let ops = backward::Operands { q: qx, kv: kvx, o, dy, lse: lv };
    match d_bias {
        Some(db) => {
            // One task per head, the batch in order: d_bias sums are thread-count independent.
            let per_head = s.q_len * s.kv_len;
            let db = f32s_mut(OP, "d_bias", db)?;
            if per_head == 0 {
                (0..s.batch * s.heads).into_par_iter().for_each(|bh| {
                    let hd = head(&s, bias, &qv, &kvv, bh / s.heads, bh % s.heads);
                    backward::backward_head(&ops, &hd, &dq, &dkv, None)
                });
                return Ok(());
            }
            db.par_chunks_mut(per_head).enumerate().for_each(|(h, db_h)| {
                for b in 0..s.batch {
                    let hd = head(&s, bias, &qv, &kvv, b, h);
                    backward::backward_head(&ops, &hd, &dq, &dkv, Some(&mut *db_h))
                }
            });
        }
        None => (0..s.batch * s.heads).into_par_iter().for_each(|bh| {
            let hd = head(&s, bias, &qv, &kvv, bh / s.heads, bh % s.heads);
            backward::backward_head(&ops, &hd, &dq, &dkv, None)
        }),
    }
    Ok(())
}
