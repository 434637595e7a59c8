//! [`PaddedAttentionOps`]: attention with key-padding masks: T5's cross-attention (with an
//! optional position bias) and the bidirectional self-attention of BERT/T5 encoders.

use super::MemoryOps;
use crate::cross_attention::CrossAttentionSpec;
use crate::{DeviceTensor, Result};

/// Attention with padding masks (BERT/T5). Backends without these ops keep the defaults, errors
/// naming the backend.
pub trait PaddedAttentionOps: MemoryOps {
    /// Attention of `q` to `kv` with padding on both sides, an optional causal mask and an
    /// optional additive `(heads, Tq, Tk)` position bias: see [`CrossAttentionSpec`] for the
    /// layouts. Writes `out` and the fp32 `lse`. Backends without it keep this default error.
    #[allow(clippy::too_many_arguments)]
    fn cross_attention_forward(
        &self,
        q: &DeviceTensor,
        kv: &DeviceTensor,
        q_valid: Option<&DeviceTensor>,
        kv_valid: Option<&DeviceTensor>,
        bias: Option<&DeviceTensor>,
        out: &mut DeviceTensor,
        lse: &mut DeviceTensor,
        spec: CrossAttentionSpec,
    ) -> Result<()> {
        let _ = (q, kv, q_valid, kv_valid, bias, out, lse, spec);
        anyhow::bail!("op `cross_attention_forward` is not supported by backend `{}`; use the cpu backend", self.name())
    }
    /// Overwrites `d_q` and `d_kv` (scores recomputed from `q`, `kv`, `bias` and `lse`) and
    /// accumulates `d_bias` `(heads, Tq, Tk)` (summed over the batch in a fixed order) when given.
    #[allow(clippy::too_many_arguments)]
    fn cross_attention_backward(
        &self,
        d_out: &DeviceTensor,
        q: &DeviceTensor,
        kv: &DeviceTensor,
        q_valid: Option<&DeviceTensor>,
        kv_valid: Option<&DeviceTensor>,
        bias: Option<&DeviceTensor>,
        out: &DeviceTensor,
        lse: &DeviceTensor,
        d_q: &mut DeviceTensor,
        d_kv: &mut DeviceTensor,
        d_bias: Option<&mut DeviceTensor>,
        spec: CrossAttentionSpec,
    ) -> Result<()> {
        let _ = (d_out, q, kv, q_valid, kv_valid, bias, out, lse, d_q, d_kv, d_bias, spec);
        anyhow::bail!(
            "op `cross_attention_backward` is not supported by backend `{}`; use the cpu backend",
            self.name()
        )
    }
    /// Bidirectional attention of row `b`'s first `lengths[b]` tokens among themselves; padded
    /// positions get zero outputs (see [`crate::padded_attention`]). `lengths` is int32 `(B)`.
    /// Backends without it keep this default, an error naming the backend.
    fn attention_padded_forward(
        &self,
        qkv: &DeviceTensor,
        lengths: &DeviceTensor,
        out: &mut DeviceTensor,
        lse: &mut DeviceTensor,
        spec: crate::PaddedAttentionSpec,
    ) -> Result<()> {
        let _ = (qkv, lengths, out, lse, spec);
        anyhow::bail!(
            "op `attention_padded_forward` is not supported by backend `{}`; use the cpu backend",
            self.name()
        )
    }
    /// Writes the whole `d_qkv` (zero at padded positions).
    #[allow(clippy::too_many_arguments)]
    fn attention_padded_backward(
        &self,
        d_out: &DeviceTensor,
        qkv: &DeviceTensor,
        lengths: &DeviceTensor,
        out: &DeviceTensor,
        lse: &DeviceTensor,
        d_qkv: &mut DeviceTensor,
        spec: crate::PaddedAttentionSpec,
    ) -> Result<()> {
        let _ = (d_out, qkv, lengths, out, lse, d_qkv, spec);
        anyhow::bail!(
            "op `attention_padded_backward` is not supported by backend `{}`; use the cpu backend",
            self.name()
        )
    }
}
