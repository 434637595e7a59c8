//! The bf16 causal/full self-attention on CPUs with AVX512-BF16: the same tiled online
//! softmax as the fp32 kernel (`super`), but q/k/v/dO are read straight from the bf16 tensors
//! (no widened copy of `qkv`, `out` or `d_out`) and every tile product runs on `vdpbf16ps`
//! ([`crate::tile_bf16`]) with fp32 accumulation. Softmax statistics (`max`, `Σ`, `lse`,
//! `D_i`) and the score / probability tiles stay fp32; the probability tile `P` and the score
//! gradient `dS` are rounded to bf16 once, right before the products that consume them (what
//! FlashAttention does on GPUs). Outputs (`out`, `d_qkv`) are rounded once from fp32.
//!
//! Score tiles are kept **row-major** here, `S (queries, keys)` (the fp32 kernel keeps them
//! transposed): `vdpbf16ps` needs its operands in pairs along the reduction axis, and a
//! bf16 row of `P` or `dS` is already a pair row along the keys.
//!
//! Per-head packed operands (thread-local scratch, built once per head from the bf16 rows):
//! * `Q`, `dO` as pair rows `(T, ⌈hd/2⌉)`: the broadcast operands of `Q·Kᵀ` and `dO·Vᵀ`;
//! * `Kᵀ`, `Vᵀ` as pair columns `(⌈hd/2⌉, T)`: the streamed operands of `Q·Kᵀ` and `dO·Vᵀ`;
//! * `V`, `K`, `Q`, `dO` as token pairs `(⌈T/2⌉, hd)`: the streamed operands of `P·V`, `dS·K`,
//!   `dSᵀ·Q` and `Pᵀ·dO`.
//!
//! Every (batch, head) is one rayon task with a fixed loop order, so results do not depend on
//! the thread count. Dropout, the mask index and `lse` are exactly as in the fp32 kernel.

use super::{validate, Layout};
use crate::check::numel;
use crate::scratch::RowWriter;
use megatron_core::anyhow::bail;
use megatron_core::half::slice::HalfFloatSliceExt;
use megatron_core::{AttentionSpec, DType, DeviceTensor, HostBuffer, Result};
use rayon::prelude::*;

mod backward;
mod forward;

/// Whether the bf16 kernels take this call: every half argument bf16 and the CPU able to run
/// `vdpbf16ps` (else the op widens through the fp32 kernel).
pub(crate) fn applies(tensors: &[&DeviceTensor]) -> bool {
    crate::tile_bf16::supported() && tensors.iter().all(|t| t.dtype() == DType::BF16)
}

fn bits<'a>(op: &str, arg: &str, t: &'a DeviceTensor) -> Result<&'a [u16]> {
    match t.host_buffer()? {
        HostBuffer::BF16(v) => Ok(v.reinterpret_cast()),
        other => bail!("cpu backend: `{op}` bf16 path needs `{arg}` in bf16, got {}", other.dtype()),
    }
}

fn bits_mut<'a>(op: &str, arg: &str, t: &'a mut DeviceTensor) -> Result<&'a mut [u16]> {
    match t.host_buffer_mut()? {
        HostBuffer::BF16(v) => Ok(v.reinterpret_cast_mut()),
        other => bail!("cpu backend: `{op}` bf16 path needs `{arg}` in bf16, got {}", other.dtype()),
    }
}

fn check_shapes(op: &str, spec: &AttentionSpec, ts: &[(&str, &DeviceTensor)]) -> Result<()> {
    validate(op, spec)?;
    let AttentionSpec { batch, seq, heads, head_dim, .. } = *spec;
    for &(name, t) in ts {
        let (n, what) = match name {
            "qkv" | "d_qkv" => (batch * seq * heads * 3 * head_dim, "(B, T, heads, 3, head_dim)"),
            "lse" => (batch * heads * seq, "(B, heads, T)"),
            _ => (batch * seq * heads * head_dim, "(B, T, heads*head_dim)"),
        };
        numel(op, name, t, n, what)?;
    }
    Ok(())
}

/// bf16 `qkv (B, T, heads, 3, hd)` → bf16 `out (B, T, heads·hd)` and fp32 `lse (B, heads, T)`.
pub(crate) fn attention_forward(
    qkv: &DeviceTensor,
    out: &mut DeviceTensor,
    lse: &mut DeviceTensor,
    spec: AttentionSpec,
) -> Result<()> {
    const OP: &str = "attention_forward";
    check_shapes(OP, &spec, &[("qkv", qkv), ("out", out), ("lse", lse)])?;
    if spec.seq == 0 || spec.batch == 0 {
        return Ok(());
    }
    let x = bits(OP, "qkv", qkv)?;
    let l = Layout::new(&spec);
    let o = RowWriter::new(bits_mut(OP, "out", out)?);
    let lv = crate::check::f32s_mut(OP, "lse", lse)?;
    lv.par_chunks_mut(spec.seq)
        .enumerate()
        .for_each(|(bh, head_lse)| forward::forward_head(x, &l, &spec, bh / spec.heads, bh % spec.heads, &o, head_lse));
    Ok(())
}

/// Backward of [`attention_forward`]: bf16 `d_out`, `qkv`, `out`, fp32 `lse` → bf16 `d_qkv`.
pub(crate) fn attention_backward(
    d_out: &DeviceTensor,
    qkv: &DeviceTensor,
    out: &DeviceTensor,
    lse: &DeviceTensor,
    d_qkv: &mut DeviceTensor,
    spec: AttentionSpec,
) -> Result<()> {
    const OP: &str = "attention_backward";
    check_shapes(OP, &spec, &[("qkv", qkv), ("d_qkv", d_qkv), ("out", out), ("d_out", d_out), ("lse", lse)])?;
    if spec.seq == 0 || spec.batch == 0 {
        return Ok(());
    }
    let (x, o, dy) = (bits(OP, "qkv", qkv)?, bits(OP, "out", out)?, bits(OP, "d_out", d_out)?);
    let lv = crate::check::f32s(OP, "lse", lse)?;
    let l = Layout::new(&spec);
    let dx = RowWriter::new(bits_mut(OP, "d_qkv", d_qkv)?);
    let seq = spec.seq;
    (0..spec.batch * spec.heads).into_par_iter().for_each(|bh| {
        let head_lse = &lv[bh * seq..(bh + 1) * seq];
        backward::backward_head(x, o, dy, head_lse, &l, &spec, bh / spec.heads, bh % spec.heads, &dx)
    });
    Ok(())
}

/// Rounds an f32 row into a bf16 destination row.
#[inline(always)]
pub(super) fn store_row(src: &[f32], dst: &mut [u16]) {
    dst.iter_mut().zip(src).for_each(|(d, &x)| *d = crate::widen::bf16_bits(x));
}

/// A bf16 row widened to f32.
#[inline(always)]
pub(super) fn widen_row(src: &[u16], dst: &mut [f32]) {
    dst.iter_mut().zip(src).for_each(|(d, &x)| *d = f32::from_bits((x as u32) << 16));
}
