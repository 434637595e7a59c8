//! [`RingAttentionOps`]: the per-block attention ops of ring attention (context parallelism, see
//! [`crate::attention_block`]).

use super::MemoryOps;
use crate::{DeviceTensor, Result};

/// Ring attention blocks (context parallelism).
pub trait RingAttentionOps: MemoryOps {
    /// Attention of `q (B, Tq, heads, hd)` to one K/V block `(B, Tk, heads, hd)` with causal
    /// masking by the int32 global positions `q_pos (Tq)`, `k_pos (Tk)`: writes `out (B, Tq,
    /// heads, hd)` and `lse (B, heads, Tq)` (see [`crate::attention_block`]). Backends without
    /// it keep this default, an error naming the backend.
    #[allow(clippy::too_many_arguments)]
    fn attention_block_forward(
        &self,
        q: &DeviceTensor,
        k: &DeviceTensor,
        v: &DeviceTensor,
        q_pos: &DeviceTensor,
        k_pos: &DeviceTensor,
        out: &mut DeviceTensor,
        lse: &mut DeviceTensor,
        spec: crate::AttentionBlockSpec,
    ) -> Result<()> {
        let _ = (q, k, v, q_pos, k_pos, out, lse, spec);
        anyhow::bail!("op `attention_block_forward` is not supported by backend `{}`; use the cpu backend", self.name())
    }
    /// Merges a block's `(block_out, block_lse)` into the running `(out, lse)` by their
    /// log-sum-exp (see [`crate::attention_block`]).
    fn attention_lse_merge(
        &self,
        out: &mut DeviceTensor,
        lse: &mut DeviceTensor,
        block_out: &DeviceTensor,
        block_lse: &DeviceTensor,
        spec: crate::AttentionBlockSpec,
    ) -> Result<()> {
        let _ = (out, lse, block_out, block_lse, spec);
        anyhow::bail!("op `attention_lse_merge` is not supported by backend `{}`; use the cpu backend", self.name())
    }
    /// Adds one block's part of the attention backward to `dq`, `dk`, `dv`, given the merged
    /// output's final `lse` and `delta = Σ dO·O` `(B, heads, Tq)` (see [`crate::attention_block`]).
    #[allow(clippy::too_many_arguments)]
    fn attention_block_backward(
        &self,
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
        spec: crate::AttentionBlockSpec,
    ) -> Result<()> {
        let _ = (d_out, q, k, v, q_pos, k_pos, lse, delta, dq, dk, dv, spec);
        anyhow::bail!(
            "op `attention_block_backward` is not supported by backend `{}`; use the cpu backend",
            self.name()
        )
    }
}
