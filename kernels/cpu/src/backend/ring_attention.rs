//! `impl RingAttentionOps for CpuBackend`: the ring-attention block ops.

use crate::CpuBackend;
use megatron_core::{DeviceTensor, Result, RingAttentionOps};

impl RingAttentionOps for CpuBackend {
    fn attention_block_forward(
        &self,
        q: &DeviceTensor,
        k: &DeviceTensor,
        v: &DeviceTensor,
        q_pos: &DeviceTensor,
        k_pos: &DeviceTensor,
        out: &mut DeviceTensor,
        lse: &mut DeviceTensor,
        spec: megatron_core::AttentionBlockSpec,
    ) -> Result<()> {
        self.run(|| crate::attention_block::attention_block_forward(q, k, v, q_pos, k_pos, out, lse, spec))
    }
    fn attention_lse_merge(
        &self,
        out: &mut DeviceTensor,
        lse: &mut DeviceTensor,
        block_out: &DeviceTensor,
        block_lse: &DeviceTensor,
        spec: megatron_core::AttentionBlockSpec,
    ) -> Result<()> {
        crate::attention_block::attention_lse_merge(out, lse, block_out, block_lse, spec)
    }
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
        spec: megatron_core::AttentionBlockSpec,
    ) -> Result<()> {
        self.run(|| {
            crate::attention_block::attention_block_backward(d_out, q, k, v, q_pos, k_pos, lse, delta, dq, dk, dv, spec)
        })
    }
}
