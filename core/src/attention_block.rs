//! [`AttentionBlockSpec`]: the per-block ops of ring attention (context parallelism, SPEC
//! §5.9). A CP rank attends its queries to one K/V block at a time and merges the partial
//! results with their log-sum-exp; backward revisits the blocks with the final statistics.
//!
//! Semantics of [`crate::RingAttentionOps::attention_block_forward`] / `_backward` and
//! [`crate::RingAttentionOps::attention_lse_merge`] (all f32):
//! * `q (B, Tq, heads, hd)`, `k`, `v (B, Tk, heads, hd)`; `q_pos (Tq)` and `k_pos (Tk)` are
//!   int32 global positions. With `causal`, query `i` sees key `j` iff `k_pos[j] <= q_pos[i]`;
//!   otherwise it sees every key of the block.
//! * Forward: `out (B, Tq, heads, hd) = softmax_j(scale · q_i·k_j) v_j` over the visible keys,
//!   `lse (B, heads, Tq) = log Σ_j exp(scale · q_i·k_j)`. A query that sees no key gets
//!   `out = 0`, `lse = -inf` (it contributes nothing to a merge).
//! * Merge: `(out, lse) ← (out·e^{lse−m} + out_b·e^{lse_b−m}, m)` with `m = log(e^{lse} +
//!   e^{lse_b})`, an exact combination of two disjoint key sets (`-inf` terms drop out).
//! * Backward, given the FINAL `lse` and `delta (B, heads, Tq) = Σ_e dO·O` of the merged output
//!   (the flash-attention form, so each block's part is independent of the others):
//!   `P = exp(scale · q·k − lse)`, `dV += Pᵀ dO`, `dS = P ∘ (dO vᵀ − delta)`,
//!   `dQ += scale · dS k`, `dK += scale · dSᵀ q`. The gradients ACCUMULATE into `dq`, `dk`,
//!   `dv`, so a rank sums the blocks it visits.

/// See the module doc.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionBlockSpec {
    pub batch: usize,
    /// `Tq`: queries per row.
    pub q_len: usize,
    /// `Tk`: keys per row of the block.
    pub k_len: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Multiplies `q·k` before the softmax.
    pub scale: f32,
    pub causal: bool,
}

impl AttentionBlockSpec {
    /// Elements of a `(B, Tq, heads, hd)` tensor.
    pub fn q_numel(&self) -> usize {
        self.batch * self.q_len * self.heads * self.head_dim
    }
    /// Elements of a `(B, Tk, heads, hd)` tensor.
    pub fn k_numel(&self) -> usize {
        self.batch * self.k_len * self.heads * self.head_dim
    }
    /// Elements of a `(B, heads, Tq)` statistics tensor.
    pub fn stat_numel(&self) -> usize {
        self.batch * self.heads * self.q_len
    }
}
