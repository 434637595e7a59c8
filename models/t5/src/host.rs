//! Small host-side pieces the T5 layers need and the Backend op list does not have: splitting
//! the fused `(N, heads, 3, hd)` QKV into the `q`/`kv` layouts of the cross-attention op (and
//! merging their gradients back), ReLU and the gated GeLU of T5 v1.1, and valid-length
//! tensors. They go through `to_host`/`from_host` (exact copies; f32 arithmetic).

use anyhow::Result;
use megatron_core::{Backend, DeviceTensor, HostBuffer};

/// `qkv (N, heads, 3, hd)` → `q (N, heads·hd)`, `kv (N, heads·2·hd)` (per head k, v).
pub fn split_qkv(
    be: &dyn Backend,
    qkv: &DeviceTensor,
    n: usize,
    heads: usize,
    hd: usize,
) -> Result<(DeviceTensor, DeviceTensor)> {
    let x = be.to_host(qkv)?.to_f32_vec();
    let (mut q, mut kv) = (Vec::with_capacity(n * heads * hd), Vec::with_capacity(n * heads * 2 * hd));
    for blk in x.chunks_exact(3 * hd) {
        q.extend_from_slice(&blk[..hd]);
        kv.extend_from_slice(&blk[hd..]);
    }
    // 2-D shapes: the linears' bias gradients sum over rows of width `heads*hd`.
    Ok((be.from_host(HostBuffer::F32(q), &[n, heads * hd])?, be.from_host(HostBuffer::F32(kv), &[n, heads * 2 * hd])?))
}

/// The inverse of [`split_qkv`] for gradients: `d_qkv (N, heads, 3, hd)`.
pub fn merge_qkv(
    be: &dyn Backend,
    dq: &DeviceTensor,
    dkv: &DeviceTensor,
    hd: usize,
    out: &mut DeviceTensor,
) -> Result<()> {
    let (q, kv) = (be.to_host(dq)?.to_f32_vec(), be.to_host(dkv)?.to_f32_vec());
    let mut m = Vec::with_capacity(q.len() * 3);
    for (qb, kvb) in q.chunks_exact(hd).zip(kv.chunks_exact(2 * hd)) {
        m.extend_from_slice(qb);
        m.extend_from_slice(kvb);
    }
    let shape = out.shape().to_vec();
    *out = be.from_host(HostBuffer::F32(m), &shape)?;
    Ok(())
}

/// int32 `[B]` valid lengths.
pub fn lengths(be: &dyn Backend, v: &[usize]) -> Result<DeviceTensor> {
    be.from_host(HostBuffer::I32(v.iter().map(|&x| x as i32).collect()), &[v.len()])
}

/// GeLU, tanh approximation, and its derivative (as the backend's `gelu_forward`).
fn gelu(x: f32) -> (f32, f32) {
    const C: f32 = 0.797_884_6;
    let u = C * (x + 0.044715 * x * x * x);
    let t = u.tanh();
    let du = C * (1.0 + 3.0 * 0.044715 * x * x);
    (0.5 * x * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)
}

/// `out = relu(x)`.
pub fn relu_forward(be: &dyn Backend, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
    let v: Vec<f32> = be.to_host(x)?.to_f32_vec().into_iter().map(|a| a.max(0.0)).collect();
    let shape = out.shape().to_vec();
    *out = be.from_host(HostBuffer::F32(v), &shape)?;
    Ok(())
}

/// `d_x = d_out · [x > 0]`.
pub fn relu_backward(be: &dyn Backend, x: &DeviceTensor, d_out: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()> {
    let (x, g) = (be.to_host(x)?.to_f32_vec(), be.to_host(d_out)?.to_f32_vec());
    let v: Vec<f32> = x.iter().zip(&g).map(|(&a, &d)| if a > 0.0 { d } else { 0.0 }).collect();
    let shape = d_x.shape().to_vec();
    *d_x = be.from_host(HostBuffer::F32(v), &shape)?;
    Ok(())
}

/// `x (N, 2F)` → `out (N, F) = gelu(x[:, :F]) * x[:, F:]`.
pub fn geglu_forward(be: &dyn Backend, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
    let xv = be.to_host(x)?.to_f32_vec();
    let f = out.shape().last().copied().unwrap_or(0);
    let mut v = Vec::with_capacity(xv.len() / 2);
    for row in xv.chunks_exact(2 * f) {
        let (a, b) = row.split_at(f);
        v.extend(a.iter().zip(b).map(|(&g, &u)| gelu(g).0 * u));
    }
    let shape = out.shape().to_vec();
    *out = be.from_host(HostBuffer::F32(v), &shape)?;
    Ok(())
}

/// Backward of [`geglu_forward`]: `d_x (N, 2F)`.
pub fn geglu_backward(be: &dyn Backend, x: &DeviceTensor, d_out: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()> {
    let (xv, g) = (be.to_host(x)?.to_f32_vec(), be.to_host(d_out)?.to_f32_vec());
    let f = d_out.shape().last().copied().unwrap_or(0);
    let mut v = Vec::with_capacity(xv.len());
    for (row, grow) in xv.chunks_exact(2 * f).zip(g.chunks_exact(f)) {
        let (a, b) = row.split_at(f);
        v.extend(a.iter().zip(b).zip(grow).map(|((&ga, &u), &d)| gelu(ga).1 * u * d));
        v.extend(a.iter().zip(grow).map(|(&ga, &d)| gelu(ga).0 * d));
    }
    let shape = d_x.shape().to_vec();
    *d_x = be.from_host(HostBuffer::F32(v), &shape)?;
    Ok(())
}

/// `t` as `dtype`: itself when it already is, else a converted copy (the host helpers and the
/// fp32 attention core produce fp32; a half model's activations are rounded once here).
pub fn as_dtype(be: &dyn Backend, t: DeviceTensor, dtype: megatron_core::DType) -> Result<DeviceTensor> {
    if t.dtype() == dtype {
        return Ok(t);
    }
    let mut out = be.zeros(t.shape(), dtype)?;
    be.cast(&t, &mut out)?;
    Ok(out)
}
