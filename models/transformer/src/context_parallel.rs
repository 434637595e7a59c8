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
//! The per-block compute is the backend's (`Backend::attention_block_forward`,
//! `attention_lse_merge`, `attention_block_backward`, see [`megatron_core::attention_block`]):
//! this module moves the blocks around the ring and merges the partial outputs in ring order.
//! It is checked against the single-rank backend attention on the whole sequence
//! (`tests/ring_attention.rs`); the ops against their f64 reference and finite differences in
//! the cpu backend's tests.
//!
//! In bf16/fp16 the activations (`qkv`, `out`, their gradients) are half; the K/V blocks
//! travel the ring in that dtype and are widened exactly for the f32 block ops, the partial
//! outputs are merged with their log-sum-exp in f32 and every result is rounded once (see
//! [`ring_attention_forward`] / [`ring_attention_backward`] for where and why).
//!
//! Layouts are the backend attention's: `qkv (B, Tl, heads, 3, hd)`, `out (B, Tl, heads·hd)`,
//! `lse (B, heads, Tl)` with `Tl = T/cp` local tokens in local order (chunk `r`, then chunk
//! `2cp−1−r`).

mod host;

use anyhow::{bail, Context, Result};
use megatron_core::{
    AttentionBlockSpec, AttentionSpec, Backend, DType, DeviceTensor, HostBuffer, ParallelContext, RotarySpec,
};

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

    /// The backend block op's spec: local queries against one rank's `Tl` keys.
    fn block_spec(&self) -> AttentionBlockSpec {
        AttentionBlockSpec {
            batch: self.b,
            q_len: self.tl,
            k_len: self.tl,
            heads: self.h,
            head_dim: self.d,
            scale: self.scale,
            causal: self.causal,
        }
    }
}

/// The ring neighbours (global ranks) of this rank in the CP group: `(next, prev)`.
fn neighbours(ctx: &ParallelContext) -> Result<(usize, usize, usize)> {
    let g = &ctx.cp_group;
    let me = g.index_of(ctx.rank).context("this rank is not in its own context-parallel group")?;
    let n = g.size();
    Ok((me, g.ranks[(me + 1) % n], g.ranks[(me + n - 1) % n]))
}

/// Sends `buf` to `next` and receives the same-sized buffer of the same dtype from `prev` over
/// the CP group (the communicator buffers sends, so send-then-receive cannot deadlock the ring).
fn ring_shift(
    bk: &dyn Backend,
    ctx: &ParallelContext,
    buf: HostBuffer,
    next: usize,
    prev: usize,
    what: &str,
) -> Result<HostBuffer> {
    let (len, dtype) = (buf.len(), buf.dtype());
    let t = bk.from_host(buf, &[len])?;
    ctx.comm.send(&ctx.cp_group, &t, next).with_context(|| format!("context-parallel ring send of {what}"))?;
    let mut r = bk.zeros(&[len], dtype)?;
    ctx.comm.recv(&ctx.cp_group, &mut r, prev).with_context(|| format!("context-parallel ring receive of {what}"))?;
    bk.to_host(&r)
}

/// `q` (widened to f32) and `[k; v]` (in the activations' dtype: what travels the ring) of the
/// local `qkv`, each `(B, Tl, heads, hd)`.
fn split_qkv(dm: &Dims, qkv: &HostBuffer) -> Result<(Vec<f32>, HostBuffer)> {
    let n = dm.n();
    let (mut q, mut kv) = (Vec::with_capacity(n), vec![0usize; 2 * n]);
    for b in 0..dm.b {
        for t in 0..dm.tl {
            for h in 0..dm.h {
                for e in 0..dm.d {
                    q.push(dm.qkv(b, t, h, 0, e));
                    kv[dm.row(b, t, h, e)] = dm.qkv(b, t, h, 1, e);
                    kv[n + dm.row(b, t, h, e)] = dm.qkv(b, t, h, 2, e);
                }
            }
        }
    }
    Ok((host::pick(qkv, &q)?.to_f32_vec(), host::pick(qkv, &kv)?))
}

/// The f32 result `x` in `dtype`: itself for f32, else rounded once (`Backend::cast`).
fn round_to(bk: &dyn Backend, x: DeviceTensor, dtype: DType) -> Result<DeviceTensor> {
    if dtype == DType::F32 {
        return Ok(x);
    }
    let mut t = bk.zeros(x.shape(), dtype)?;
    bk.cast(&x, &mut t)?;
    Ok(t)
}

/// The int32 global positions of CP rank `rank`'s local tokens (a `(Tl)` tensor).
fn positions(bk: &dyn Backend, dm: &Dims, rank: usize) -> Result<DeviceTensor> {
    let pos = local_positions(dm.tl * dm.cp, dm.cp, rank).into_iter().map(|p| p as i32).collect::<Vec<_>>();
    bk.from_host(HostBuffer::I32(pos), &[dm.tl])
}

/// A `(B, Tl, heads, hd)` f32 tensor of `x`.
fn rows(bk: &dyn Backend, dm: &Dims, x: &[f32]) -> Result<DeviceTensor> {
    bk.from_host(HostBuffer::F32(x.to_vec()), &[dm.b, dm.tl, dm.h, dm.d])
}

/// Ring attention forward of this rank's `qkv (B, Tl, heads, 3, hd)` over the whole sequence
/// of the CP group: writes `out (B, Tl, heads·hd)` and `lse (B, heads, Tl)`. Each step is the
/// backend's block attention of the local queries to the K/V block held, merged into the
/// running output by log-sum-exp (`Backend::attention_block_forward`, `attention_lse_merge`).
///
/// Precision: `qkv` and `out` may be bf16/fp16 (the model's activations); `lse` is f32. The
/// K/V blocks travel in the activations' dtype (Megatron's: half the bytes of fp32); each is
/// widened exactly to f32 for the f32 block op, the partial outputs and their log-sum-exp are
/// merged in f32, and the merged output is rounded once into `out` — the rounding the
/// single-rank half attention does.
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
    let (q, mut kv) = split_qkv(&dm, &bk.to_host(qkv)?)?;
    let n = dm.n();
    let (bs, q_t, q_pos) = (dm.block_spec(), rows(bk, &dm, &q)?, positions(bk, &dm, me)?);
    let stats = dm.b * dm.h * dm.tl;
    let mut o = bk.zeros(&[dm.b, dm.tl, dm.h, dm.d], DType::F32)?;
    let mut m = bk.from_host(HostBuffer::F32(vec![f32::NEG_INFINITY; stats]), &[dm.b, dm.h, dm.tl])?;
    let mut block_o = bk.zeros(&[dm.b, dm.tl, dm.h, dm.d], DType::F32)?;
    let mut block_lse = bk.zeros(&[dm.b, dm.h, dm.tl], DType::F32)?;
    for step in 0..dm.cp {
        let owner = (me + dm.cp - step) % dm.cp; // whose K/V block this rank holds now
        let kv32 = kv.to_f32_vec(); // exact: every half value is an f32
        let (k, v) = (rows(bk, &dm, &kv32[..n])?, rows(bk, &dm, &kv32[n..])?);
        let k_pos = positions(bk, &dm, owner)?;
        bk.attention_block_forward(&q_t, &k, &v, &q_pos, &k_pos, &mut block_o, &mut block_lse, bs)
            .context("context-parallel ring attention block")?;
        bk.attention_lse_merge(&mut o, &mut m, &block_o, &block_lse, bs)?;
        if step + 1 < dm.cp {
            kv = ring_shift(bk, ctx, kv, next, prev, "a K/V block")?;
        }
    }
    o.reshape(out.shape())?;
    m.reshape(lse.shape())?;
    *out = round_to(bk, o, out.dtype())?;
    *lse = m;
    Ok(())
}

/// Backward of [`ring_attention_forward`]: overwrites `d_qkv (B, Tl, heads, 3, hd)` from
/// `d_out (B, Tl, heads·hd)`, the forward's `out` and `lse`. Each K/V block goes round the
/// ring again with its accumulating `dK`/`dV` (`Backend::attention_block_backward` with the
/// final `lse` and `delta = Σ dO·O`), which travel home with it at the end.
///
/// Precision (bf16/fp16 `d_out`, `qkv`, `out`, `d_qkv`): the K/V blocks travel in the
/// activations' dtype as in the forward, but their `dK`/`dV` travel and accumulate in f32 and
/// are rounded once, in `d_qkv`. Rounding them to half at every hop would add `cp − 1`
/// roundings of a partial sum (each up to u of the running total, bf16 u = 2^-8) that the
/// single-rank half attention does not make — it sums a key's gradient over all queries in f32
/// and rounds once — so the ring keeps exactly that: the same one rounding, only the f32
/// summation order differs. The cost is ring traffic: `dK`/`dV` at 4 bytes, K/V at 2
/// (backward sends 12 bytes per K/V element pair instead of fp32's 16). `dQ` stays on the rank
/// and is accumulated by the block op in f32, rounded once too.
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
    let (q, mut kv) = split_qkv(&dm, &bk.to_host(qkv)?)?;
    let (d_o, o) = (bk.to_host(d_out)?.to_f32_vec(), bk.to_host(out)?.to_f32_vec());
    let n = dm.n();
    // delta_i = dO_i · O_i (the softmax backward's row term, from the stored, possibly rounded,
    // output as the single-rank kernel does), (B, heads, Tl).
    let mut delta = vec![0.0f32; dm.b * dm.h * dm.tl];
    for b in 0..dm.b {
        for h in 0..dm.h {
            for i in 0..dm.tl {
                delta[dm.lse(b, h, i)] = (0..dm.d).map(|e| d_o[dm.row(b, i, h, e)] * o[dm.row(b, i, h, e)]).sum();
            }
        }
    }
    let delta = bk.from_host(HostBuffer::F32(delta), &[dm.b, dm.h, dm.tl])?;
    let (bs, q_t, d_o, q_pos) = (dm.block_spec(), rows(bk, &dm, &q)?, rows(bk, &dm, &d_o)?, positions(bk, &dm, me)?);
    let mut dq = bk.zeros(&[dm.b, dm.tl, dm.h, dm.d], DType::F32)?;
    // [dk; dv] (f32) of the block this rank holds.
    let mut dkv = vec![0.0f32; 2 * n];
    for step in 0..dm.cp {
        let owner = (me + dm.cp - step) % dm.cp;
        let kv32 = kv.to_f32_vec();
        let (k, v) = (rows(bk, &dm, &kv32[..n])?, rows(bk, &dm, &kv32[n..])?);
        let (mut dk, mut dv) = (rows(bk, &dm, &dkv[..n])?, rows(bk, &dm, &dkv[n..])?);
        let k_pos = positions(bk, &dm, owner)?;
        bk.attention_block_backward(&d_o, &q_t, &k, &v, &q_pos, &k_pos, lse, &delta, &mut dq, &mut dk, &mut dv, bs)
            .context("context-parallel ring attention block backward")?;
        dkv[..n].copy_from_slice(&bk.to_host(&dk)?.to_f32_vec());
        dkv[n..].copy_from_slice(&bk.to_host(&dv)?.to_f32_vec());
        if step + 1 < dm.cp {
            kv = ring_shift(bk, ctx, kv, next, prev, "a K/V block")?;
            dkv = ring_shift(bk, ctx, HostBuffer::F32(dkv), next, prev, "a dK/dV block")?.to_f32_vec();
        }
    }
    // The block held now belongs to the next rank: send its dK/dV home, receive ours.
    if dm.cp > 1 {
        dkv = ring_shift(bk, ctx, HostBuffer::F32(dkv), next, prev, "a finished dK/dV block")?.to_f32_vec();
    }
    let dq = bk.to_host(&dq)?.to_f32_vec();
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
    let d = bk.from_host(HostBuffer::F32(d), d_qkv.shape())?;
    *d_qkv = round_to(bk, d, d_qkv.dtype())?;
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
    let mut host = bk.to_host(qkv)?; // in the activations' dtype: the rotation rounds once, as unsplit
    for b in 0..spec.batch {
        for c in 0..2 {
            let start = (b * tl + c * chunk) * width;
            let block = host::slice(&host, start..start + chunk * width)?;
            let mut t = bk.from_host(block, &[1, chunk, width])?;
            let offset = global_position(c * chunk, tl, cp, rank);
            bk.rotary_scaled(
                &mut t,
                RotarySpec { batch: 1, seq: chunk, position_offset: offset, ..spec },
                scaling,
                inverse,
            )?;
            host::write(&mut host, start, &bk.to_host(&t)?)?;
        }
    }
    *qkv = bk.from_host(host, qkv.shape())?;
    Ok(())
}
