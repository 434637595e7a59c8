//! [`AttentionOps`]: causal (or full) self-attention over a fused QKV tensor ([`AttentionSpec`])
//! and the grouped-query expansion into that layout.

use super::MemoryOps;
use crate::gqa::GqaSpec;
use crate::{DeviceTensor, HostBuffer, Result};

/// Causal (or full) multi-head self-attention over a fused QKV tensor.
///
/// `qkv` is `(B, T, heads, 3, head_dim)`: Megatron's fused layout, per head its q, k and v
/// rows (SPEC §4.2 with `ng = np`). `out` is `(B, T, heads*head_dim)`, `lse` (the
/// log-sum-exp of every score row, kept for the recomputing backward) is `(B, heads, T)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionSpec {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub causal: bool,
    /// Multiplies `q·k` before the softmax; Megatron's default is `1/sqrt(head_dim)`.
    pub scale: f32,
    /// Dropout on the attention probabilities (0 = off). The mask is a pure function of
    /// `(dropout_seed, b, h, i, j)` so backward regenerates it instead of storing it.
    pub dropout_p: f32,
    pub dropout_seed: u64,
}

/// Self-attention over the fused QKV layout and the GQA expansion into it.
pub trait AttentionOps: MemoryOps {
    /// See [`AttentionSpec`] for layouts.
    fn attention_forward(
        &self,
        qkv: &DeviceTensor,
        out: &mut DeviceTensor,
        lse: &mut DeviceTensor,
        spec: AttentionSpec,
    ) -> Result<()>;
    /// Writes the whole `d_qkv` (scores recomputed from `qkv` and `lse`).
    fn attention_backward(
        &self,
        d_out: &DeviceTensor,
        qkv: &DeviceTensor,
        out: &DeviceTensor,
        lse: &DeviceTensor,
        d_qkv: &mut DeviceTensor,
        spec: AttentionSpec,
    ) -> Result<()>;
    /// Grouped-query attention: the fused `(N, ng, r+2, hn)` QKV into the per-head
    /// `(N, ng*r, 3, hn)` the attention ops take (see [`crate::gqa`]). The default goes through
    /// the host (exact, a copy); a backend may override it.
    fn gqa_expand(&self, src: &DeviceTensor, dst: &mut DeviceTensor, spec: GqaSpec) -> Result<()> {
        let s = self.to_host(src)?.to_f32_vec();
        let mut d = vec![0.0; spec.expanded_len()];
        crate::gqa::gqa_expand_host(&s, &mut d, spec)?;
        let shape = dst.shape().to_vec();
        *dst = self.from_host(HostBuffer::F32(d), &shape)?;
        Ok(())
    }
    /// The backward of [`AttentionOps::gqa_expand`]: overwrites `d_src (N, ng, r+2, hn)`, summing the
    /// key/value gradients of each group's heads.
    fn gqa_reduce(&self, d_dst: &DeviceTensor, d_src: &mut DeviceTensor, spec: GqaSpec) -> Result<()> {
        let d = self.to_host(d_dst)?.to_f32_vec();
        let mut s = vec![0.0; spec.grouped_len()];
        crate::gqa::gqa_reduce_host(&d, &mut s, spec)?;
        let shape = d_src.shape().to_vec();
        *d_src = self.from_host(HostBuffer::F32(s), &shape)?;
        Ok(())
    }
}
