//! [`PaddedAttentionSpec`]: bidirectional self-attention with a key-padding mask (BERT and T5
//! encoders, SPEC §4.8): rows of one batch hold different numbers of real tokens, padding is
//! neither attended to nor attends.
//!
//! Semantics of [`crate::PaddedAttentionOps::attention_padded_forward`] / `_backward`:
//! * `qkv` is the fused `(B, T, heads, 3, head_dim)` of the causal op, `out` `(B, T,
//!   heads*head_dim)`, `lse` `(B, heads, T)` f32, `lengths` int32 `(B)` with
//!   `0 <= lengths[b] <= T`: row `b` has real tokens at positions `[0, lengths[b])` and padding
//!   after them (Megatron's `padding_mask` is such a prefix: `[CLS] … [SEP]` then pad).
//! * Query `i < len` attends keys `j < len` with `softmax(scale · q_i·k_j)` (Megatron's
//!   `mask[b, i, j] = not (real_i and real_j)`); `lse` is the log-sum-exp of those scores.
//! * A padded query `i >= len` gets `out = 0` and `lse = 0`, and every padded position gets a
//!   zero `d_qkv` (Megatron's masked softmax leaves garbage there that never reaches a real
//!   token; zeros make the op's output well defined).
//! * Dropout on the probabilities: row `b` uses the mask of the dense op's row of length
//!   `len` (`((h·len + i)·len + j)` element indices) under the seed
//!   [`padded_row_seed`]`(dropout_seed, b)`, so a row's mask depends only on its own length.

/// See the module doc.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PaddedAttentionSpec {
    pub batch: usize,
    /// `T`: positions per row including padding.
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Multiplies `q·k` before the softmax; Megatron's default is `1/sqrt(head_dim)`.
    pub scale: f32,
    pub dropout_p: f32,
    pub dropout_seed: u64,
}

/// The dropout seed of batch row `b` (a splitmix-style odd-multiplier offset, so rows differ).
pub fn padded_row_seed(seed: u64, b: usize) -> u64 {
    seed.wrapping_add((b as u64).wrapping_add(1).wrapping_mul(0xD1B5_4A32_D192_ED03))
}

/// Checks `lengths` against `T` and returns them as `usize`; the error names the row.
pub fn validate_lengths(op: &str, lengths: &[i32], spec: &PaddedAttentionSpec) -> crate::Result<Vec<usize>> {
    if lengths.len() != spec.batch {
        anyhow::bail!("`{op}`: {} lengths given for a batch of {} rows", lengths.len(), spec.batch);
    }
    lengths
        .iter()
        .enumerate()
        .map(|(b, &l)| {
            if l < 0 || l as usize > spec.seq {
                anyhow::bail!("`{op}`: row {b} has length {l}, outside [0, T = {}]", spec.seq);
            }
            Ok(l as usize)
        })
        .collect()
}
