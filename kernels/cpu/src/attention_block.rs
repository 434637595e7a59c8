//! The per-block ops of ring attention (`Backend::attention_block_*`, `attention_lse_merge`;
//! semantics in [`megatron_core::attention_block`]).
//!
//! One rayon task per `(b, head)`: a task computes its own output rows (forward) or its own
//! `dQ`, `dK`, `dV` rows (backward, the key rows summed over queries in query order), and the
//! results are written back in task order, so nothing depends on scheduling or thread count.
//! Dot products and sums run in a fixed order over the head dimension and the keys.

use crate::check::{f32s, f32s_mut, i32s, numel};
use megatron_core::anyhow::bail;
use megatron_core::{AttentionBlockSpec, DeviceTensor, Result};
use rayon::prelude::*;

/// Index helpers for the `(B, T, heads, hd)` and `(B, heads, T)` layouts.
#[derive(Clone, Copy)]
struct Lay {
    s: AttentionBlockSpec,
}

impl Lay {
    fn q(&self, b: usize, i: usize, h: usize) -> usize {
        ((b * self.s.q_len + i) * self.s.heads + h) * self.s.head_dim
    }
    fn k(&self, b: usize, j: usize, h: usize) -> usize {
        ((b * self.s.k_len + j) * self.s.heads + h) * self.s.head_dim
    }
    fn stat(&self, b: usize, h: usize, i: usize) -> usize {
        (b * self.s.heads + h) * self.s.q_len + i
    }
    /// Whether query `i` sees key `j`.
    fn visible(&self, qp: &[i32], kp: &[i32], i: usize, j: usize) -> bool {
        !self.s.causal || kp[j] <= qp[i]
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn check_spec(op: &str, s: &AttentionBlockSpec) -> Result<()> {
    if s.heads == 0 || s.head_dim == 0 || s.q_len == 0 || s.k_len == 0 {
        bail!("cpu backend: `{op}` needs heads, head_dim, q_len and k_len >= 1, got {s:?}");
    }
    if !s.scale.is_finite() {
        bail!("cpu backend: `{op}` needs a finite scale, got {}", s.scale);
    }
    Ok(())
}

/// `(q, k, v, q_pos, k_pos)` as host slices.
type Inputs<'a> = (&'a [f32], &'a [f32], &'a [f32], &'a [i32], &'a [i32]);

/// Checks the shared inputs and returns them.
fn inputs<'a>(op: &str, s: &AttentionBlockSpec, t: [&'a DeviceTensor; 5]) -> Result<Inputs<'a>> {
    check_spec(op, s)?;
    numel(op, "q", t[0], s.q_numel(), "(B, Tq, heads, head_dim)")?;
    numel(op, "k", t[1], s.k_numel(), "(B, Tk, heads, head_dim)")?;
    numel(op, "v", t[2], s.k_numel(), "(B, Tk, heads, head_dim)")?;
    numel(op, "q_pos", t[3], s.q_len, "(Tq)")?;
    numel(op, "k_pos", t[4], s.k_len, "(Tk)")?;
    Ok((
        f32s(op, "q", t[0])?,
        f32s(op, "k", t[1])?,
        f32s(op, "v", t[2])?,
        i32s(op, "q_pos", t[3])?,
        i32s(op, "k_pos", t[4])?,
    ))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_block_forward(
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    q_pos: &DeviceTensor,
    k_pos: &DeviceTensor,
    out: &mut DeviceTensor,
    lse: &mut DeviceTensor,
    s: AttentionBlockSpec,
) -> Result<()> {
    const OP: &str = "attention_block_forward";
    let (qv, kv, vv, qp, kp) = inputs(OP, &s, [q, k, v, q_pos, k_pos])?;
    numel(OP, "out", out, s.q_numel(), "(B, Tq, heads, head_dim)")?;
    numel(OP, "lse", lse, s.stat_numel(), "(B, heads, Tq)")?;
    let (l, d) = (Lay { s }, s.head_dim);
    // Per (b, h): (out rows (Tq, hd), lse (Tq)).
    let tasks: Vec<(Vec<f32>, Vec<f32>)> = (0..s.batch * s.heads)
        .into_par_iter()
        .map(|bh| {
            let (b, h) = (bh / s.heads, bh % s.heads);
            let (mut o, mut m) = (vec![0.0f32; s.q_len * d], vec![f32::NEG_INFINITY; s.q_len]);
            let mut sc = vec![0.0f32; s.k_len];
            for i in 0..s.q_len {
                let qi = &qv[l.q(b, i, h)..l.q(b, i, h) + d];
                let mut mx = f32::NEG_INFINITY;
                for (j, x) in sc.iter_mut().enumerate() {
                    *x = if l.visible(qp, kp, i, j) {
                        s.scale * dot(qi, &kv[l.k(b, j, h)..l.k(b, j, h) + d])
                    } else {
                        f32::NEG_INFINITY
                    };
                    mx = mx.max(*x);
                }
                if mx == f32::NEG_INFINITY {
                    continue; // no visible key: out 0, lse -inf
                }
                let (mut sum, oi) = (0.0f32, &mut o[i * d..(i + 1) * d]);
                for (j, &x) in sc.iter().enumerate() {
                    if x == f32::NEG_INFINITY {
                        continue;
                    }
                    let p = (x - mx).exp();
                    sum += p;
                    for (y, vj) in oi.iter_mut().zip(&vv[l.k(b, j, h)..l.k(b, j, h) + d]) {
                        *y += p * vj;
                    }
                }
                oi.iter_mut().for_each(|y| *y /= sum);
                m[i] = mx + sum.ln();
            }
            (o, m)
        })
        .collect();
    let ov = f32s_mut(OP, "out", out)?;
    for (bh, (o, _)) in tasks.iter().enumerate() {
        let (b, h) = (bh / s.heads, bh % s.heads);
        for i in 0..s.q_len {
            ov[l.q(b, i, h)..l.q(b, i, h) + d].copy_from_slice(&o[i * d..(i + 1) * d]);
        }
    }
    let lv = f32s_mut(OP, "lse", lse)?;
    for (bh, (_, m)) in tasks.iter().enumerate() {
        let (b, h) = (bh / s.heads, bh % s.heads);
        lv[l.stat(b, h, 0)..l.stat(b, h, 0) + s.q_len].copy_from_slice(m);
    }
    Ok(())
}

/// `(out, lse) ← merge((out, lse), (block_out, block_lse))` (see the module doc).
pub(crate) fn attention_lse_merge(
    out: &mut DeviceTensor,
    lse: &mut DeviceTensor,
    block_out: &DeviceTensor,
    block_lse: &DeviceTensor,
    s: AttentionBlockSpec,
) -> Result<()> {
    const OP: &str = "attention_lse_merge";
    check_spec(OP, &s)?;
    numel(OP, "out", out, s.q_numel(), "(B, Tq, heads, head_dim)")?;
    numel(OP, "block_out", block_out, s.q_numel(), "(B, Tq, heads, head_dim)")?;
    numel(OP, "lse", lse, s.stat_numel(), "(B, heads, Tq)")?;
    numel(OP, "block_lse", block_lse, s.stat_numel(), "(B, heads, Tq)")?;
    let (bo, bl) = (f32s(OP, "block_out", block_out)?, f32s(OP, "block_lse", block_lse)?);
    let lv = f32s_mut(OP, "lse", lse)?;
    let (l, d) = (Lay { s }, s.head_dim);
    // Per statistic: the weights of the old and the block part.
    let mut w = vec![(1.0f32, 0.0f32); s.stat_numel()];
    for (idx, (old, wi)) in lv.iter_mut().zip(w.iter_mut()).enumerate() {
        let blk = bl[idx];
        if blk == f32::NEG_INFINITY {
            continue;
        }
        if *old == f32::NEG_INFINITY {
            (*old, *wi) = (blk, (0.0, 1.0));
            continue;
        }
        let hi = old.max(blk);
        let new = hi + ((*old - hi).exp() + (blk - hi).exp()).ln();
        *wi = ((*old - new).exp(), (blk - new).exp());
        *old = new;
    }
    let ov = f32s_mut(OP, "out", out)?;
    for b in 0..s.batch {
        for i in 0..s.q_len {
            for h in 0..s.heads {
                let (wo, wb) = w[l.stat(b, h, i)];
                let r = l.q(b, i, h);
                for (y, x) in ov[r..r + d].iter_mut().zip(&bo[r..r + d]) {
                    *y = *y * wo + x * wb;
                }
            }
        }
    }
    Ok(())
}

/// `dq`, `dk`, `dv` += this block's part of the attention backward (see the module doc).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_block_backward(
    d_out: &DeviceTensor,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    q_pos: &DeviceTensor,
    k_pos: &DeviceTensor,
    lse: &DeviceTensor,
    delta: &DeviceTensor,
    dq: &mut DeviceTensor,
    dk: &mut DeviceTensor,
    dv: &mut DeviceTensor,
    s: AttentionBlockSpec,
) -> Result<()> {
    const OP: &str = "attention_block_backward";
    let (qv, kv, vv, qp, kp) = inputs(OP, &s, [q, k, v, q_pos, k_pos])?;
    numel(OP, "d_out", d_out, s.q_numel(), "(B, Tq, heads, head_dim)")?;
    numel(OP, "lse", lse, s.stat_numel(), "(B, heads, Tq)")?;
    numel(OP, "delta", delta, s.stat_numel(), "(B, heads, Tq)")?;
    numel(OP, "dq", dq, s.q_numel(), "(B, Tq, heads, head_dim)")?;
    numel(OP, "dk", dk, s.k_numel(), "(B, Tk, heads, head_dim)")?;
    numel(OP, "dv", dv, s.k_numel(), "(B, Tk, heads, head_dim)")?;
    let (go, lv, dl) = (f32s(OP, "d_out", d_out)?, f32s(OP, "lse", lse)?, f32s(OP, "delta", delta)?);
    let (l, d) = (Lay { s }, s.head_dim);
    // Per (b, h): dQ rows (Tq, hd), dK and dV rows (Tk, hd).
    let tasks: Vec<[Vec<f32>; 3]> = (0..s.batch * s.heads)
        .into_par_iter()
        .map(|bh| {
            let (b, h) = (bh / s.heads, bh % s.heads);
            let (mut gq, mut gk, mut gv) =
                (vec![0.0f32; s.q_len * d], vec![0.0f32; s.k_len * d], vec![0.0f32; s.k_len * d]);
            for i in 0..s.q_len {
                let m = lv[l.stat(b, h, i)];
                if m == f32::NEG_INFINITY {
                    continue; // the query saw no key at all
                }
                let (qi, gi) = (&qv[l.q(b, i, h)..l.q(b, i, h) + d], &go[l.q(b, i, h)..l.q(b, i, h) + d]);
                for j in 0..s.k_len {
                    if !l.visible(qp, kp, i, j) {
                        continue;
                    }
                    let (kj, vj) = (&kv[l.k(b, j, h)..l.k(b, j, h) + d], &vv[l.k(b, j, h)..l.k(b, j, h) + d]);
                    let p = (s.scale * dot(qi, kj) - m).exp();
                    let ds = p * (dot(gi, vj) - dl[l.stat(b, h, i)]) * s.scale;
                    for e in 0..d {
                        gv[j * d + e] += p * gi[e];
                        gq[i * d + e] += ds * kj[e];
                        gk[j * d + e] += ds * qi[e];
                    }
                }
            }
            [gq, gk, gv]
        })
        .collect();
    for (name, t, which, rows) in [("dq", dq, 0, s.q_len), ("dk", dk, 1, s.k_len), ("dv", dv, 2, s.k_len)] {
        let tv = f32s_mut(OP, name, t)?;
        for (bh, parts) in tasks.iter().enumerate() {
            let (b, h) = (bh / s.heads, bh % s.heads);
            for r in 0..rows {
                let at = if which == 0 { l.q(b, r, h) } else { l.k(b, r, h) };
                for (y, x) in tv[at..at + d].iter_mut().zip(&parts[which][r * d..(r + 1) * d]) {
                    *y += x;
                }
            }
        }
    }
    Ok(())
}
