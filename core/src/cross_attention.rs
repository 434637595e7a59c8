//! [`CrossAttentionSpec`]: the shapes and options of the cross-attention op
//! ([`crate::PaddedAttentionOps::cross_attention_forward`] / [`crate::PaddedAttentionOps::cross_attention_backward`]),
//! the attention of the T5 decoder to the encoder output, and of any attention that needs
//! separate query and key/value tensors, padding on both sides or an additive position bias
//! (T5's relative position buckets, SPEC §4.4).
//!
//! Layouts (row-major):
//! * `q` `(B, Tq, heads, head_dim)`; `kv` `(B, Tk, heads, 2, head_dim)` (per head its k row,
//!   then its v row: Megatron's `linear_kv` output);
//! * `q_valid`, `kv_valid`: optional int32 `[B]` valid lengths (padding on the right):
//!   query `i` of row `b` exists when `i < q_valid[b]`, key `j` when `j < kv_valid[b]`;
//! * `bias`: optional `(heads, Tq, Tk)`, added to the scaled scores (shared by the batch);
//! * `out` `(B, Tq, heads*head_dim)`; `lse` `(B, heads, Tq)` fp32, the log-sum-exp of every
//!   score row, kept for the recomputing backward.
//!
//! Query `i` attends to the keys `j < kv_valid[b]` (and `j <= i` when `causal`). A padded
//! query, or one that sees no key, gets a zero output row, `lse = 0` and zero gradients.

/// See the module docs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrossAttentionSpec {
    pub batch: usize,
    /// Query positions `Tq`.
    pub q_len: usize,
    /// Key/value positions `Tk`.
    pub kv_len: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Query `i` sees only keys `j <= i` (decoder self-attention given as q and kv).
    pub causal: bool,
    /// Multiplies `q·k` before the bias is added (`1/sqrt(head_dim)` in Megatron; 1 in T5).
    pub scale: f32,
    /// Dropout on the probabilities (0 = off); element `(b, h, i, j)` uses index
    /// `((b·heads + h)·Tq + i)·Tk + j` of the backend's dropout mask for `dropout_seed`.
    pub dropout_p: f32,
    pub dropout_seed: u64,
}

impl CrossAttentionSpec {
    pub fn q_numel(&self) -> usize {
        self.batch * self.q_len * self.heads * self.head_dim
    }
    pub fn kv_numel(&self) -> usize {
        self.batch * self.kv_len * self.heads * 2 * self.head_dim
    }
    pub fn bias_numel(&self) -> usize {
        self.heads * self.q_len * self.kv_len
    }
    pub fn lse_numel(&self) -> usize {
        self.batch * self.heads * self.q_len
    }
}
