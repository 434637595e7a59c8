//! `--qk-layernorm` (Megatron's `q_layernorm` / `k_layernorm`): a LayerNorm or RMSNorm over
//! `head_dim` of every query head and every key, before the rotary embedding.
//!
//! It acts on the per-head fused `qkv (N, heads, 3, hn)` the attention ops take: the q slots
//! (0) and the k slots (1) are gathered into contiguous `(N·heads, hn)` rows, normalized by
//! the norm layers (whose kernels keep the statistics) and written back; v is left alone.
//! With GQA the keys are normalized after the expansion, once per head of the group: the norm
//! is per row, so the values equal normalizing the group's key once; the backward sums the
//! copies' weight gradients (and `gqa_reduce` the input gradients), which is the chain rule of
//! the normalize-then-copy order Megatron uses.
//!
//! The weights are replicated over tensor parallelism while each rank sees only its heads, so
//! their gradients are partial sums: [`all_reduce_qk_norm_grads`] adds them over TP (Megatron's
//! `_allreduce_layernorm_grads` for `qk_layernorm`).
//!
//! The gather/scatter goes through host copies (exact, backend-independent); q/k norms are a
//! small share of a layer's work.

use crate::init::ModuleBuilder;
use crate::norm::{NormKind, NormLayer};
use crate::spec::SpecProvider;
use crate::step::{empty, ensure_buffer};
use anyhow::{Context, Result};
use megatron_core::{Backend, DType, DeviceTensor, HostBuffer, ParallelContext, Param, ReduceOp};

/// Whether `p` is a q/k layernorm parameter (name ends in `q_layernorm.*` / `k_layernorm.*`).
pub fn is_qk_norm_param(p: &Param) -> bool {
    p.name.contains(".q_layernorm.") || p.name.contains(".k_layernorm.")
}

/// SUM all-reduce over TP of the q/k layernorm gradients among `params`, in the given order.
/// Not needed (and not to be repeated) when sequence parallelism already reduced every
/// replicated parameter.
pub fn all_reduce_qk_norm_grads(ctx: &ParallelContext, params: Vec<&mut Param>) -> Result<()> {
    if ctx.tp_group.size() <= 1 {
        return Ok(());
    }
    for p in params.into_iter().filter(|p| is_qk_norm_param(p)) {
        ctx.comm
            .all_reduce(&ctx.tp_group, &mut p.grad, ReduceOp::Sum)
            .with_context(|| format!("tensor-parallel all-reduce of the gradient of {}", p.name))?;
    }
    Ok(())
}

pub struct QkNorm {
    pub q_layernorm: Box<dyn NormLayer>,
    pub k_layernorm: Box<dyn NormLayer>,
    act: DType,
    q_in: DeviceTensor,  // (N·heads, hn) queries before the norm, kept for backward
    k_in: DeviceTensor,  // (N·heads, hn) keys before the norm, kept for backward
    q_out: DeviceTensor, // (N·heads, hn) scratch
    k_out: DeviceTensor, // (N·heads, hn) scratch
}

/// Slot `slot` (0 = q, 1 = k) of `x (rows, 3, hn)` as `(rows, hn)`.
fn gather(x: &[f32], slot: usize, hn: usize) -> Vec<f32> {
    x.chunks_exact(3 * hn).flat_map(|h| h[slot * hn..(slot + 1) * hn].iter().copied()).collect()
}

/// Writes `rows (rows, hn)` into slot `slot` of `x (rows, 3, hn)`.
fn scatter(x: &mut [f32], rows: &[f32], slot: usize, hn: usize) {
    for (h, r) in x.chunks_exact_mut(3 * hn).zip(rows.chunks_exact(hn)) {
        h[slot * hn..(slot + 1) * hn].copy_from_slice(r);
    }
}

fn to_tensor(bk: &dyn Backend, data: Vec<f32>, shape: &[usize], dtype: DType, out: &mut DeviceTensor) -> Result<()> {
    let t = bk.from_host(HostBuffer::F32(data), shape)?;
    if dtype == DType::F32 {
        *out = t;
        Ok(())
    } else {
        ensure_buffer(bk, out, shape, dtype)?;
        bk.cast(&t, out)
    }
}

impl QkNorm {
    /// `{prefix}.q_layernorm` and `{prefix}.k_layernorm` over `head_dim`.
    pub fn new(
        b: &ModuleBuilder,
        provider: &dyn SpecProvider,
        prefix: &str,
        kind: NormKind,
        head_dim: usize,
        eps: f32,
    ) -> Result<QkNorm> {
        let bk = b.backend.as_ref();
        Ok(QkNorm {
            q_layernorm: provider.norm(b, &format!("{prefix}.q_layernorm"), kind, head_dim, eps)?,
            k_layernorm: provider.norm(b, &format!("{prefix}.k_layernorm"), kind, head_dim, eps)?,
            act: b.dtype(),
            q_in: empty(bk)?,
            k_in: empty(bk)?,
            q_out: empty(bk)?,
            k_out: empty(bk)?,
        })
    }

    /// Normalizes q and k of `qkv (N, heads, 3, hn)` in place.
    pub fn forward(&mut self, bk: &dyn Backend, qkv: &mut DeviceTensor, hn: usize) -> Result<()> {
        let dtype = qkv.dtype();
        let mut x = bk.to_host(qkv)?.to_f32_vec();
        let rows = x.len() / (3 * hn);
        for (slot, input, out) in [(0, &mut self.q_in, &mut self.q_out), (1, &mut self.k_in, &mut self.k_out)] {
            to_tensor(bk, gather(&x, slot, hn), &[rows, hn], self.act, input)?;
            ensure_buffer(bk, out, &[rows, hn], self.act)?;
        }
        self.q_layernorm.forward(&self.q_in, &mut self.q_out)?;
        self.k_layernorm.forward(&self.k_in, &mut self.k_out)?;
        scatter(&mut x, &bk.to_host(&self.q_out)?.to_f32_vec(), 0, hn);
        scatter(&mut x, &bk.to_host(&self.k_out)?.to_f32_vec(), 1, hn);
        let shape = qkv.shape().to_vec();
        to_tensor(bk, x, &shape, dtype, qkv)
    }

    /// Backward in place on `d_qkv (N, heads, 3, hn)` (the gradient of the normalized q/k
    /// becomes that of the raw q/k); accumulates the norm weights' gradients.
    pub fn backward(&mut self, bk: &dyn Backend, d_qkv: &mut DeviceTensor, hn: usize) -> Result<()> {
        let dtype = d_qkv.dtype();
        let mut d = bk.to_host(d_qkv)?.to_f32_vec();
        let rows = d.len() / (3 * hn);
        let (mut d_out, mut d_in) = (empty(bk)?, empty(bk)?);
        ensure_buffer(bk, &mut d_in, &[rows, hn], self.act)?;
        for slot in 0..2 {
            to_tensor(bk, gather(&d, slot, hn), &[rows, hn], self.act, &mut d_out)?;
            if slot == 0 {
                self.q_layernorm.backward(&d_out, &self.q_in, &mut d_in)?;
            } else {
                self.k_layernorm.backward(&d_out, &self.k_in, &mut d_in)?;
            }
            scatter(&mut d, &bk.to_host(&d_in)?.to_f32_vec(), slot, hn);
        }
        let shape = d_qkv.shape().to_vec();
        to_tensor(bk, d, &shape, dtype, d_qkv)
    }

    /// The raw q/k and the norms' statistics of the last forward.
    pub fn saved_activations_mut(&mut self) -> Vec<&mut DeviceTensor> {
        let mut v = vec![&mut self.q_in, &mut self.k_in];
        v.extend(self.q_layernorm.saved_activations_mut());
        v.extend(self.k_layernorm.saved_activations_mut());
        v
    }

    pub fn params(&self) -> Vec<&Param> {
        self.q_layernorm.params().into_iter().chain(self.k_layernorm.params()).collect()
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        self.q_layernorm.params_mut().into_iter().chain(self.k_layernorm.params_mut()).collect()
    }
}
