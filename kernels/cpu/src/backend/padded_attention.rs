//! `impl PaddedAttentionOps for CpuBackend`: cross-attention and key-padding-mask attention.

use crate::widen::{input, input_opt, out_opt, Out};
use crate::CpuBackend;
use megatron_core::{CrossAttentionSpec, DeviceTensor, PaddedAttentionOps, Result};

impl PaddedAttentionOps for CpuBackend {
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
        self.run(|| {
            let (q, kv, bias) = (input(q)?, input(kv)?, input_opt(bias)?);
            let mut o = Out::new(out, false)?;
            crate::cross_attention::cross_attention_forward(
                &q,
                &kv,
                q_valid,
                kv_valid,
                bias.as_deref(),
                o.t(),
                lse,
                spec,
            )?;
            o.finish()
        })
    }
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
        self.run(|| {
            let (d_out, q, kv, out, bias) = (input(d_out)?, input(q)?, input(kv)?, input(out)?, input_opt(bias)?);
            let (mut dq, mut dkv) = (Out::new(d_q, false)?, Out::new(d_kv, false)?);
            let mut db = out_opt(d_bias, true)?;
            crate::cross_attention::cross_attention_backward(
                &d_out,
                &q,
                &kv,
                q_valid,
                kv_valid,
                bias.as_deref(),
                &out,
                lse,
                dq.t(),
                dkv.t(),
                db.as_mut().map(|d| d.t()),
                spec,
            )?;
            dq.finish()?;
            dkv.finish()?;
            db.map_or(Ok(()), Out::finish)
        })
    }
    fn attention_padded_forward(
        &self,
        qkv: &DeviceTensor,
        lengths: &DeviceTensor,
        out: &mut DeviceTensor,
        lse: &mut DeviceTensor,
        spec: megatron_core::PaddedAttentionSpec,
    ) -> Result<()> {
        self.run(|| {
            let qkv = input(qkv)?;
            let mut o = Out::new(out, false)?;
            crate::padded_attention::attention_padded_forward(&qkv, lengths, o.t(), lse, spec)?;
            o.finish()
        })
    }
    fn attention_padded_backward(
        &self,
        d_out: &DeviceTensor,
        qkv: &DeviceTensor,
        lengths: &DeviceTensor,
        out: &DeviceTensor,
        lse: &DeviceTensor,
        d_qkv: &mut DeviceTensor,
        spec: megatron_core::PaddedAttentionSpec,
    ) -> Result<()> {
        self.run(|| {
            let (d_out, qkv, out) = (input(d_out)?, input(qkv)?, input(out)?);
            let mut o = Out::new(d_qkv, false)?;
            crate::padded_attention::attention_padded_backward(&d_out, &qkv, lengths, &out, lse, o.t(), spec)?;
            o.finish()
        })
    }
}
