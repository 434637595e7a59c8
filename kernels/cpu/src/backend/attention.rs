//! `impl AttentionOps for CpuBackend`: fused-QKV self-attention (native bf16 tiles when
//! available); GQA keeps the core defaults.

use crate::widen::{input, Out};
use crate::{attention, CpuBackend};
use megatron_core::{AttentionOps, AttentionSpec, DeviceTensor, Result};

impl AttentionOps for CpuBackend {
    fn attention_forward(
        &self,
        qkv: &DeviceTensor,
        out: &mut DeviceTensor,
        lse: &mut DeviceTensor,
        spec: AttentionSpec,
    ) -> Result<()> {
        let dot = self.bf16_kernel() == crate::gemm_half::Kernel::Dp;
        self.run(|| {
            if dot && attention::bf16::applies(&[qkv, out]) {
                return attention::bf16::attention_forward(qkv, out, lse, spec);
            }
            let qkv = input(qkv)?;
            let mut o = Out::new(out, false)?;
            attention::attention_forward(&qkv, o.t(), lse, spec)?;
            o.finish()
        })
    }
    fn attention_backward(
        &self,
        d_out: &DeviceTensor,
        qkv: &DeviceTensor,
        out: &DeviceTensor,
        lse: &DeviceTensor,
        d_qkv: &mut DeviceTensor,
        spec: AttentionSpec,
    ) -> Result<()> {
        let dot = self.bf16_kernel() == crate::gemm_half::Kernel::Dp;
        self.run(|| {
            if dot && attention::bf16::applies(&[d_out, qkv, out, d_qkv]) {
                return attention::bf16::attention_backward(d_out, qkv, out, lse, d_qkv, spec);
            }
            let (d_out, qkv, out) = (input(d_out)?, input(qkv)?, input(out)?);
            let mut o = Out::new(d_qkv, false)?;
            attention::attention_backward(&d_out, &qkv, &out, lse, o.t(), spec)?;
            o.finish()
        })
    }
}
