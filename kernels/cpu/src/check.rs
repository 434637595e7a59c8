//! Argument validation shared by every op: dtype/storage checks that turn a tensor into an
//! fp32 (or int32) slice, and element-count checks whose errors name the op and argument.

use megatron_core::anyhow::{anyhow, bail};
use megatron_core::{DType, DeviceTensor, HostBuffer, Result, Storage};

fn wrong(op: &str, arg: &str, t: &DeviceTensor, want: DType) -> megatron_core::anyhow::Error {
    match t.storage() {
        Storage::Device(d) => anyhow!(
            "cpu backend: `{op}` argument `{arg}` lives on backend `{}`; move it to the host first",
            d.backend_name()
        ),
        Storage::Host(b) => anyhow!(
            "cpu backend: `{op}` does not support dtype {} for argument `{arg}` (it computes in {want}); \
             cast the tensor with Backend::cast first",
            b.dtype()
        ),
    }
}

/// The fp32 elements of `t`, or an error naming `op`, `arg`, the dtype and the backend.
pub(crate) fn f32s<'a>(op: &str, arg: &str, t: &'a DeviceTensor) -> Result<&'a [f32]> {
    match t.storage() {
        Storage::Host(HostBuffer::F32(v)) => Ok(v),
        _ => Err(wrong(op, arg, t, DType::F32)),
    }
}

/// Mutable fp32 elements of `t` (see [`f32s`]).
pub(crate) fn f32s_mut<'a>(op: &str, arg: &str, t: &'a mut DeviceTensor) -> Result<&'a mut [f32]> {
    if !matches!(t.storage(), Storage::Host(HostBuffer::F32(_))) {
        return Err(wrong(op, arg, t, DType::F32));
    }
    match t.storage_mut() {
        Storage::Host(HostBuffer::F32(v)) => Ok(v),
        _ => unreachable!("checked just above"),
    }
}

/// The int32 elements of `t` (token ids, targets).
pub(crate) fn i32s<'a>(op: &str, arg: &str, t: &'a DeviceTensor) -> Result<&'a [i32]> {
    match t.storage() {
        Storage::Host(HostBuffer::I32(v)) => Ok(v),
        _ => Err(wrong(op, arg, t, DType::I32)),
    }
}

/// Requires `t` to hold exactly `expected` elements; `what` explains the expected shape.
pub(crate) fn numel(op: &str, arg: &str, t: &DeviceTensor, expected: usize, what: &str) -> Result<()> {
    if t.numel() != expected {
        bail!(
            "cpu backend: `{op}` argument `{arg}` has shape {:?} ({} elements) but {what} needs {expected} elements",
            t.shape(),
            t.numel()
        );
    }
    Ok(())
}

/// Requires `a` and `b` to have the same number of elements.
pub(crate) fn same_numel(op: &str, a_name: &str, a: &DeviceTensor, b_name: &str, b: &DeviceTensor) -> Result<()> {
    if a.numel() != b.numel() {
        bail!(
            "cpu backend: `{op}` arguments `{a_name}` {:?} and `{b_name}` {:?} must have the same number of elements",
            a.shape(),
            b.shape()
        );
    }
    Ok(())
}

/// `(rows, cols)` of a tensor read as `[N, C]` with `C` its last dim; a scalar or empty shape
/// is an error.
pub(crate) fn rows_cols(op: &str, arg: &str, t: &DeviceTensor) -> Result<(usize, usize)> {
    match t.shape().last() {
        Some(&c) if c > 0 => Ok((t.numel() / c, c)),
        _ => bail!("cpu backend: `{op}` argument `{arg}` has shape {:?}; it needs a non-empty last dim", t.shape()),
    }
}

/// Requires a finite value in `[lo, hi)` (dropout probabilities and the like).
pub(crate) fn in_range(op: &str, arg: &str, v: f32, lo: f32, hi: f32) -> Result<()> {
    if !(v >= lo && v < hi) {
        bail!("cpu backend: `{op}` argument `{arg}` = {v} must lie in [{lo}, {hi})");
    }
    Ok(())
}

/// The elements of a float tensor of any dtype (fp32, bf16, fp16).
pub(crate) fn floats<'a>(op: &str, arg: &str, t: &'a DeviceTensor) -> Result<crate::gemm_half::Src<'a>> {
    use crate::gemm_half::Src;
    match t.storage() {
        Storage::Host(HostBuffer::F32(v)) => Ok(Src::F32(v)),
        Storage::Host(HostBuffer::BF16(v)) => Ok(Src::BF16(v)),
        Storage::Host(HostBuffer::F16(v)) => Ok(Src::F16(v)),
        _ => Err(wrong(op, arg, t, DType::F32)),
    }
}

/// Mutable elements of a float tensor of any dtype.
pub(crate) fn floats_mut<'a>(op: &str, arg: &str, t: &'a mut DeviceTensor) -> Result<crate::gemm_half::Dst<'a>> {
    use crate::gemm_half::Dst;
    if !t.dtype().is_float() || !matches!(t.storage(), Storage::Host(_)) {
        return Err(wrong(op, arg, t, DType::F32));
    }
    Ok(match t.storage_mut() {
        Storage::Host(HostBuffer::F32(v)) => Dst::F32(v),
        Storage::Host(HostBuffer::BF16(v)) => Dst::BF16(v),
        Storage::Host(HostBuffer::F16(v)) => Dst::F16(v),
        _ => unreachable!("checked just above"),
    })
}

/// Whether `t` is a bf16 or fp16 tensor (widened at the op boundary).
pub(crate) fn is_half(t: &DeviceTensor) -> bool {
    matches!(t.dtype(), DType::BF16 | DType::F16)
}
