//! Context parallelism (`--context-parallel-size cp`, SPEC §5.9): the sequence of every
//! microbatch is cut into `2·cp` equal chunks and CP rank `r` keeps chunks `r` and `2cp−1−r`
//! (Megatron's causal load balance: every rank gets one early and one late chunk, so the causal
//! work is even). Everything but the attention is per token and runs on the local tokens only;
//! the attention is a ring ([`ring_attention_forward`] / [`ring_attention_backward`]): the K/V
//! block of each CP rank travels around the CP group, every rank attends its queries to each
//! block it sees (causal by global position) and merges the partial outputs with their
//! log-sum-exp; backward sends the K/V blocks around again together with their accumulating
//! `dK`/`dV`, which end back on their owner.
//!
//! The kernel here is a plain host loop over `(b, head, query, key)` in a fixed order (so the
//! result does not depend on threads), fp32 like the backend's attention; the partial outputs
//! are merged in ring order. It is checked against the single-rank backend attention on the
//! whole sequence (`tests/ring_attention.rs`).
//!
//! Layouts are the backend attention's: `qkv (B, Tl, heads, 3, hd)`, `out (B, Tl, heads·hd)`,
//! `lse (B, heads, Tl)` with `Tl = T/cp` local tokens in local order (chunk `r`, then chunk
//! `2cp−1−r`).

use anyhow::{bail, Context, Result};
use megatron_core::{AttentionSpec, Backend, DType, DeviceTensor, HostBuffer, ParallelContext, RotarySpec};

/// Global position of local token `t` of CP rank `rank` (`local_seq = T/cp` tokens per row).
pub fn global_position(t: usize, local_seq: usize, cp: usize, rank: usize) -> usize {
    let chunk = local_seq / 2;
    if t < chunk {
        rank * chunk + t
    } else {
        (2 * cp - 1 - rank) * chunk + (t - chunk)
    }
}

/// The `T/cp` global positions held by CP rank `rank`, in local order.
pub fn local_positions(seq: usize, cp: usize, rank: usize) -> Vec<usize> {
    let local = seq / cp;
    (0..local).map(|t| global_position(t, local, cp, rank)).collect()
}

/// Checks Megatron's rule `T % (2·cp) == 0`.
pub fn check_sequence(seq: usize, cp: usize) -> Result<()> {
    if cp > 1 && !seq.is_multiple_of(2 * cp) {
        bail!(
            "--context-parallel-size {cp} cuts each sequence into 2 x {cp} chunks: --seq-length {seq} must be \
             divisible by {}",
            2 * cp
        );
    }
    Ok(())
}

/// Host view of one attention problem: sizes and this rank's place in the ring.
#[derive(Clone, Copy)]
struct Dims {
    b: usize,
    tl: usize,
    h: usize,
    d: usize,
    cp: usize,
    scale: f32,
    causal: bool,
}

impl Dims {
    fn new(ctx: &ParallelContext, spec: &AttentionSpec) -> Result<Dims> {
        if spec.dropout_p > 0.0 {
            bail!("context parallelism does not apply attention dropout; run with --attention-dropout 0");
        }
        if !spec.seq.is_multiple_of(2) {
            bail!("context-parallel local sequence {} must hold two equal chunks", spec.seq);
        }
        let cp = ctx.cp_group.size();
        Ok(Dims {
            b: spec.batch,
            tl: spec.seq,
            h: spec.heads,
            d: spec.head_dim,
            cp,
            scale: spec.scale,
            causal: spec.causal,
        })
    }

    /// Index of element `(b, t, head, which, e)` in the fused qkv.
    fn qkv(&self, b: usize, t: usize, head: usize, which: usize, e: usize) -> usize {
        (((b * self.tl + t) * self.h + head) * 3 + which) * self.d + e
    }

    /// Index of `(b, t, head, e)` in a `(B, Tl, heads, hd)` tensor (out, k, v, dk, dv).
    fn row(&self, b: usize, t: usize, head: usize, e: usize) -> usize {
        ((b * self.tl + t) * self.h + head) * self.d + e
    }

    fn lse(&self, b: usize, head: usize, t: usize) -> usize {
        (b * self.h + head) * self.tl + t
    }

    fn n(&self) -> usize {
        self.b * self.tl * self.h * self.d
    }
}

/// The ring neighbours (global ranks) of this rank in the CP group: `(next, prev)`.
fn neighbours(ctx: &ParallelContext) -> Result<(usize, usize, usize)> {
    let g = &ctx.cp_group;
    let me = g.index_of(ctx.rank).context("this rank is not in its own context-parallel group")?;
    let n = g.size();
    Ok((me, g.ranks[(me + 1) % n], g.ranks[(me + n - 1) % n]))
}

/// Sends `buf` to `next` and receives the same-sized buffer from `prev` over the CP group
/// (the communicator buffers sends, so send-then-receive cannot deadlock the ring).
fn ring_shift(bk: &dyn Backend, ctx: &ParallelContext, buf: &[f32], next: usize, prev: usize) -> Result<Vec<f32>> {
    let t = bk.from_host(HostBuffer::F32(buf.to_vec()), &[buf.len()])?;
    ctx.comm.send(&ctx.cp_group, &t, next).context("context-parallel ring send of a K/V block")?;
    let mut r = bk.zeros(&[buf.len()], DType::F32)?;
    ctx.comm.recv(&ctx.cp_group, &mut r, prev).context("context-parallel ring receive of a K/V block")?;
    Ok(bk.to_host(&r)?.to_f32_vec())
}

/// `[k; v]` of the local qkv, each `(B, Tl, heads, hd)`.
fn split_kv(dm: &Dims, qkv: &[f32]) -> Vec<f32> {
    let n = dm.n();
    let mut kv = vec![0.0f32; 2 * n];
    for b in 0..dm.b {
        for t in 0..dm.tl {
            for h in 0..dm.h {
                for e in 0..dm.d {
                    kv[dm.row(b, t, h, e)] = qkv[dm.qkv(b, t, h, 1, e)];
                    kv[n + dm.row(b, t, h, e)] = qkv[dm.qkv(b, t, h, 2, e)];
                }
            }
        }
    }
    kv
}

/// `scale · q_i · k_j` of query row `(b, i, h)` and key row `(b, j, h)` of the block `kv`.
fn score(dm: &Dims, qkv: &[f32], kv: &[f32], (b, h): (usize, usize), i: usize, j: usize) -> f32 {
    let (q0, k0) = (dm.qkv(b, i, h, 0, 0), dm.row(b, j, h, 0));
    let s: f32 = qkv[q0..q0 + dm.d].iter().zip(&kv[k0..k0 + dm.d]).map(|(a, c)| a * c).sum();
    s * dm.scale
}

/// Ring attention forward of this rank's `qkv (B, Tl, heads, 3, hd)` over the whole sequence
/// of the CP group: writes `out (B, Tl, heads·hd)` and `lse (B, heads, Tl)`.
pub fn ring_attention_forward(
    bk: &dyn Backend,
    ctx: &ParallelContext,
    qkv: &DeviceTensor,
    out: &mut DeviceTensor,
    lse: &mut DeviceTensor,
    spec: AttentionSpec,
) -> Result<()> {
    let dm = Dims::new(ctx, &spec)?;
    let (me, next, prev) = neighbours(ctx)?;
    let qkv = bk.to_host(qkv)?.to_f32_vec();
    let q_pos = local_positions(dm.tl * dm.cp, dm.cp, me);
    let n = dm.n();
    let mut o = vec![0.0f32; n];
    let mut m_lse = vec![f32::NEG_INFINITY; dm.b * dm.h * dm.tl];
    let mut kv = split_kv(&dm, &qkv);
    let mut block_o = vec![0.0f32; dm.d];
    let mut s_row = vec![0.0f32; dm.tl];
    for step in 0..dm.cp {
        let owner = (me + dm.cp - step) % dm.cp; // whose K/V block this rank holds now
        let k_pos = local_positions(dm.tl * dm.cp, dm.cp, owner);
        for b in 0..dm.b {
            for h in 0..dm.h {
                for (i, &qp) in q_pos.iter().enumerate() {
                    // Partial softmax of query i over this block, merged by log-sum-exp.
                    let mut mx = f32::NEG_INFINITY;
                    for (j, (s, &kp)) in s_row.iter_mut().zip(&k_pos).enumerate() {
                        *s = if dm.causal && kp > qp { f32::NEG_INFINITY } else { score(&dm, &qkv, &kv, (b, h), i, j) };
                        mx = mx.max(*s);
                    }
                    if mx == f32::NEG_INFINITY {
                        continue; // every key of this block is in the future
                    }
                    let mut sum = 0.0f32;
                    block_o.iter_mut().for_each(|x| *x = 0.0);
                    for (j, &s) in s_row.iter().enumerate() {
                        if s == f32::NEG_INFINITY {
                            continue;
                        }
                        let p = (s - mx).exp();
                        sum += p;
                        let v0 = n + dm.row(b, j, h, 0);
                        for (x, v) in block_o.iter_mut().zip(&kv[v0..v0 + dm.d]) {
                            *x += p * v;
                        }
                    }
                    let block_lse = mx + sum.ln();
                    let li = dm.lse(b, h, i);
                    let old = m_lse[li];
                    let new = if old == f32::NEG_INFINITY {
                        block_lse
                    } else {
                        let hi = old.max(block_lse);
                        hi + ((old - hi).exp() + (block_lse - hi).exp()).ln()
                    };
                    let (w_old, w_blk) = if old == f32::NEG_INFINITY {
                        (0.0, 1.0 / sum)
                    } else {
                        ((old - new).exp(), (block_lse - new).exp() / sum)
                    };
                    for (e, x) in block_o.iter().enumerate() {
                        let oi = dm.row(b, i, h, e);
                        o[oi] = o[oi] * w_old + x * w_blk;
                    }
                    m_lse[li] = new;
                }
            }
        }
        if step + 1 < dm.cp {
            kv = ring_shift(bk, ctx, &kv, next, prev)?;
        }
    }
    *out = bk.from_host(HostBuffer::F32(o), out.shape())?;
    *lse = bk.from_host(HostBuffer::F32(m_lse), lse.shape())?;
    Ok(())
}

/// Backward of [`ring_attention_forward`]: overwrites `d_qkv (B, Tl, heads, 3, hd)` from
/// `d_out (B, Tl, heads·hd)`, the forward's `out` and `lse` (scores recomputed). The `dK`/`dV`
/// of each block accumulate on the ranks it visits and travel home with it.
#[allow(clippy::too_many_arguments)] // the backend attention backward's arguments plus the CP context
pub fn ring_attention_backward(
    bk: &dyn Backend,
    ctx: &ParallelContext,
    d_out: &DeviceTensor,
    qkv: &DeviceTensor,
    out: &DeviceTensor,
    lse: &DeviceTensor,
    d_qkv: &mut DeviceTensor,
    spec: AttentionSpec,
) -> Result<()> {
    let dm = Dims::new(ctx, &spec)?;
    let (me, next, prev) = neighbours(ctx)?;
    let qkv_h = bk.to_host(qkv)?.to_f32_vec();
    let (d_o, o, m_lse) =
        (bk.to_host(d_out)?.to_f32_vec(), bk.to_host(out)?.to_f32_vec(), bk.to_host(lse)?.to_f32_vec());
    let q_pos = local_positions(dm.tl * dm.cp, dm.cp, me);
    let n = dm.n();
    // D_i = dO_i · O_i (the softmax backward's row term).
    let mut big_d = vec![0.0f32; dm.b * dm.h * dm.tl];
    for b in 0..dm.b {
        for h in 0..dm.h {
            for i in 0..dm.tl {
                big_d[dm.lse(b, h, i)] = (0..dm.d).map(|e| d_o[dm.row(b, i, h, e)] * o[dm.row(b, i, h, e)]).sum();
            }
        }
    }
    let mut dq = vec![0.0f32; n];
    // [k; v; dk; dv] of the block this rank holds.
    let mut blk = split_kv(&dm, &qkv_h);
    blk.resize(4 * n, 0.0);
    for step in 0..dm.cp {
        let owner = (me + dm.cp - step) % dm.cp;
        let k_pos = local_positions(dm.tl * dm.cp, dm.cp, owner);
        let (kv, dkv) = blk.split_at_mut(2 * n);
        for b in 0..dm.b {
            for h in 0..dm.h {
                for (i, &qp) in q_pos.iter().enumerate() {
                    let li = dm.lse(b, h, i);
                    for (j, &kp) in k_pos.iter().enumerate() {
                        if dm.causal && kp > qp {
                            continue;
                        }
                        let s = score(&dm, &qkv_h, kv, (b, h), i, j);
                        let p = (s - m_lse[li]).exp();
                        let (r_i, r_j, q0, d) = (dm.row(b, i, h, 0), dm.row(b, j, h, 0), dm.qkv(b, i, h, 0, 0), dm.d);
                        let g = &d_o[r_i..r_i + d];
                        // dV_j += p dO_i; dp = dO_i · v_j.
                        let dp: f32 = g.iter().zip(&kv[n + r_j..n + r_j + d]).map(|(g, v)| g * v).sum();
                        for (dv, g) in dkv[n + r_j..n + r_j + d].iter_mut().zip(g) {
                            *dv += p * g;
                        }
                        let ds = p * (dp - big_d[li]) * dm.scale;
                        for (x, k) in dq[r_i..r_i + d].iter_mut().zip(&kv[r_j..r_j + d]) {
                            *x += ds * k;
                        }
                        for (dk, q) in dkv[r_j..r_j + d].iter_mut().zip(&qkv_h[q0..q0 + d]) {
                            *dk += ds * q;
                        }
                    }
                }
            }
        }
        if step + 1 < dm.cp {
            blk = ring_shift(bk, ctx, &blk, next, prev)?;
        }
    }
    // The block held now belongs to the next rank: send its dK/dV home, receive ours.
    let dkv = if dm.cp > 1 { ring_shift(bk, ctx, &blk[2 * n..], next, prev)? } else { blk[2 * n..].to_vec() };
    let mut d = vec![0.0f32; 3 * n];
    for b in 0..dm.b {
        for t in 0..dm.tl {
            for h in 0..dm.h {
                for e in 0..dm.d {
                    let r = dm.row(b, t, h, e);
                    d[dm.qkv(b, t, h, 0, e)] = dq[r];
                    d[dm.qkv(b, t, h, 1, e)] = dkv[r];
                    d[dm.qkv(b, t, h, 2, e)] = dkv[n + r];
                }
            }
        }
    }
    *d_qkv = bk.from_host(HostBuffer::F32(d), d_qkv.shape())?;
    Ok(())
}

/// Rotary embedding of this CP rank's `qkv (B, Tl, heads, 3, hd)` at the global positions of
/// its two chunks: each `(row, chunk)` block is contiguous and rotated by the backend op at its
/// own position offset (RoPE is per token, so this equals rotating the whole sequence and
/// keeping the rank's tokens). `inverse` is the backward.
pub fn rotary_context_parallel(
    bk: &dyn Backend,
    ctx: &ParallelContext,
    qkv: &mut DeviceTensor,
    spec: RotarySpec,
    inverse: bool,
) -> Result<()> {
    rotary_context_parallel_scaled(bk, ctx, qkv, spec, megatron_core::RopeScaling::None, inverse)
}

/// [`rotary_context_parallel`] with rescaled frequencies (`Backend::rotary_scaled`).
pub fn rotary_context_parallel_scaled(
    bk: &dyn Backend,
    ctx: &ParallelContext,
    qkv: &mut DeviceTensor,
    spec: RotarySpec,
    scaling: megatron_core::RopeScaling,
    inverse: bool,
) -> Result<()> {
    let (cp, rank, tl) = (ctx.cp_group.size(), ctx.cp_rank, spec.seq);
    let chunk = tl / 2;
    let width = qkv.numel() / (spec.batch * tl).max(1);
    let mut host = bk.to_host(qkv)?.to_f32_vec();
    for b in 0..spec.batch {
        for c in 0..2 {
            let start = (b * tl + c * chunk) * width;
            let block = &mut host[start..start + chunk * width];
            let mut t = bk.from_host(HostBuffer::F32(block.to_vec()), &[1, chunk, width])?;
            let offset = global_position(c * chunk, tl, cp, rank);
            bk.rotary_scaled(
                &mut t,
                RotarySpec { batch: 1, seq: chunk, position_offset: offset, ..spec },
                scaling,
                inverse,
            )?;
            block.copy_from_slice(&bk.to_host(&t)?.to_f32_vec());
        }
    }
    *qkv = bk.from_host(HostBuffer::F32(host), qkv.shape())?;
    Ok(())
}
