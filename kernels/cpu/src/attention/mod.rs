//! Tiled online-softmax ("flash") self-attention over the fused `(B, T, heads, 3, head_dim)`
//! QKV, forward and backward side by side.
//!
//! Forward keeps only `out` `(B, T, heads*head_dim)` and `lse` `(B, heads, T)`. Backward
//! recomputes each score tile from q, k and `lse`, and uses `D_i = Σ_d dO_id·O_id` (which
//! equals `Σ_j P_ij dP_ij` even with dropout) for the softmax gradient. Rayon runs one task per
//! (batch, head); each packs its q/k/v (and dO) rows contiguous, walks [`TILE`]×[`TILE`] tiles
//! (skipping tiles above the causal diagonal) with the register-blocked products of
//! [`crate::tile`], and writes its own rows of the outputs directly.
//!
//! Score tiles are kept **transposed**, `S^T (keys, queries)`, so that every tile product
//! broadcasts an element of one operand against a contiguous row of the other (K, V, dO rows;
//! Q^T and dO^T packed per query tile / per head), and the softmax statistics (`max`, `Σ`,
//! `lse_i`, `D_i`) are vectors along the contiguous query axis.
//!
//! Memory, B=4, heads=12: a materialised `(B, heads, T, T)` fp32 score matrix is 192 MiB at
//! T=1024 and 3 GiB at T=4096 (twice that with the saved probabilities). Here the only saved
//! activation is `lse`: 192 KiB at T=1024, 768 KiB at 4096. Working memory is per running task
//! (thread-local, reused across calls): forward 2·T·head_dim floats of packed K/V plus a few
//! 64×80 tiles (≈ 0.6 MiB at T=1024, 2.1 MiB at 4096); backward ≈ 9·T·head_dim floats of packed
//! operands and dq/dk/dv accumulators (2.3 MiB at T=1024, 9.1 MiB at 4096).
//!
//! Layout: this file holds the op entry points (validation, scheduling); `forward.rs` and
//! `backward.rs` the per-head kernels. bf16 tensors on CPUs with AVX512-BF16 go to [`bf16`]
//! instead (same tiling and statistics, `vdpbf16ps` tile products, no widened copies).
//!
//! Dropout on the probabilities: element `(b, h, i, j)` uses index `((b·heads+h)·T+i)·T+j` of
//! [`DropoutMask`]; `lse` is of the undropped scores.

use crate::check::{f32s, f32s_mut, in_range, numel};
use crate::rng::DropoutMask;
use crate::scratch::RowWriter;
use megatron_core::anyhow::bail;
use megatron_core::{AttentionSpec, DeviceTensor, Result};
use rayon::prelude::*;

mod backward;
pub(crate) mod bf16;
mod forward;

/// Query and key tile edge.
pub const TILE: usize = 64;

/// Offsets into the fused layouts for one (batch, head).
#[derive(Clone, Copy)]
pub(super) struct Layout {
    pub t: usize,
    pub heads: usize,
    pub hd: usize,
    /// Row stride of q/k/v inside `qkv`: `heads*3*head_dim`.
    pub rs: usize,
    /// Row stride of `out`/`d_out`: `heads*head_dim`.
    pub rs_o: usize,
}

impl Layout {
    fn new(spec: &AttentionSpec) -> Layout {
        let (t, heads, hd) = (spec.seq, spec.heads, spec.head_dim);
        Layout { t, heads, hd, rs: heads * 3 * hd, rs_o: heads * hd }
    }
    /// Offset of q (`slot` 0), k (1) or v (2) of token `t`.
    pub(super) fn qkv(&self, b: usize, h: usize, t: usize, slot: usize) -> usize {
        ((b * self.t + t) * self.heads + h) * 3 * self.hd + slot * self.hd
    }
    pub(super) fn o(&self, b: usize, h: usize, t: usize) -> usize {
        (b * self.t + t) * self.rs_o + h * self.hd
    }
    pub(super) fn mask_index(&self, b: usize, h: usize, i: usize, j: usize) -> u64 {
        (((b * self.heads + h) * self.t + i) * self.t + j) as u64
    }
}

fn validate(op: &str, spec: &AttentionSpec) -> Result<()> {
    if spec.head_dim == 0 || spec.heads == 0 {
        bail!("cpu backend: `{op}` needs heads and head_dim >= 1, got {spec:?}");
    }
    if !spec.scale.is_finite() {
        bail!("cpu backend: `{op}` needs a finite scale, got {}", spec.scale);
    }
    in_range(op, "dropout_p", spec.dropout_p, 0.0, 1.0)
}

fn shape_qkv(s: &AttentionSpec) -> String {
    format!("(B={}, T={}, heads={}, 3, head_dim={})", s.batch, s.seq, s.heads, s.head_dim)
}

/// Sets the entries of a transposed score tile `S^T (kn, qn)` (row stride `ld`) whose key `ks+c` comes after
/// the query `qs+r` to −∞ (causal mask); tiles fully below the diagonal are untouched.
#[inline(always)]
pub(super) fn mask_causal(st: &mut [f32], kn: usize, qn: usize, ld: usize, ks: usize, qs: usize) {
    if ks + kn <= qs + 1 {
        return;
    }
    for (c, row) in st.chunks_mut(ld).take(kn).enumerate() {
        let hidden = (ks + c).saturating_sub(qs).min(qn);
        row[..hidden].fill(f32::NEG_INFINITY);
    }
}

/// Multiplies a probability tile `P^T (kn, qn)` (row stride `ld`) by its dropout factors.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn apply_dropout(
    pt: &mut [f32],
    kn: usize,
    qn: usize,
    ld: usize,
    mask: &DropoutMask,
    l: &Layout,
    b: usize,
    h: usize,
    ks: usize,
    qs: usize,
) {
    for (c, row) in pt.chunks_mut(ld).take(kn).enumerate() {
        for (r, v) in row[..qn].iter_mut().enumerate() {
            *v *= mask.factor(l.mask_index(b, h, qs + r, ks + c));
        }
    }
}

pub(crate) fn attention_forward(
    qkv: &DeviceTensor,
    out: &mut DeviceTensor,
    lse: &mut DeviceTensor,
    spec: AttentionSpec,
) -> Result<()> {
    const OP: &str = "attention_forward";
    validate(OP, &spec)?;
    let AttentionSpec { batch, seq, heads, head_dim, .. } = spec;
    numel(OP, "qkv", qkv, batch * seq * heads * 3 * head_dim, &shape_qkv(&spec))?;
    numel(OP, "out", out, batch * seq * heads * head_dim, "(B, T, heads*head_dim)")?;
    numel(OP, "lse", lse, batch * heads * seq, "(B, heads, T)")?;
    if seq == 0 || batch == 0 {
        return Ok(());
    }
    let x = f32s(OP, "qkv", qkv)?;
    let l = Layout::new(&spec);
    let lv = f32s_mut(OP, "lse", lse)?;
    let o = RowWriter::new(f32s_mut(OP, "out", out)?);
    // One task per (b, h): its lse is a contiguous chunk, its output rows are disjoint.
    lv.par_chunks_mut(seq)
        .enumerate()
        .for_each(|(bh, head_lse)| forward::forward_head(x, &l, &spec, bh / heads, bh % heads, &o, head_lse));
    Ok(())
}

pub(crate) fn attention_backward(
    d_out: &DeviceTensor,
    qkv: &DeviceTensor,
    out: &DeviceTensor,
    lse: &DeviceTensor,
    d_qkv: &mut DeviceTensor,
    spec: AttentionSpec,
) -> Result<()> {
    const OP: &str = "attention_backward";
    validate(OP, &spec)?;
    let AttentionSpec { batch, seq, heads, head_dim, .. } = spec;
    numel(OP, "qkv", qkv, batch * seq * heads * 3 * head_dim, &shape_qkv(&spec))?;
    numel(OP, "d_qkv", d_qkv, batch * seq * heads * 3 * head_dim, &shape_qkv(&spec))?;
    numel(OP, "out", out, batch * seq * heads * head_dim, "(B, T, heads*head_dim)")?;
    numel(OP, "d_out", d_out, batch * seq * heads * head_dim, "(B, T, heads*head_dim)")?;
    numel(OP, "lse", lse, batch * heads * seq, "(B, heads, T)")?;
    if seq == 0 || batch == 0 {
        return Ok(());
    }
    let (x, o, dy) = (f32s(OP, "qkv", qkv)?, f32s(OP, "out", out)?, f32s(OP, "d_out", d_out)?);
    let lv = f32s(OP, "lse", lse)?;
    let l = Layout::new(&spec);
    let dx = RowWriter::new(f32s_mut(OP, "d_qkv", d_qkv)?);
    // One task per (b, h); each writes only its own head's q/k/v rows of d_qkv.
    (0..batch * heads).into_par_iter().for_each(|bh| {
        let head_lse = &lv[bh * seq..(bh + 1) * seq];
        backward::backward_head(x, o, dy, head_lse, &l, &spec, bh / heads, bh % heads, &dx)
    });
    Ok(())
}
