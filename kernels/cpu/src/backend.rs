//! `impl Backend for CpuBackend`: every trait method validates through its module and runs
//! inside this backend's rayon pool.

use crate::widen::{input, input_opt, out_opt, Out};
use crate::{
    activation, attention, elementwise, embedding, gemm, kv_attention, kv_slots, loss, memory, norm, optim, rotary,
    CpuBackend,
};
use megatron_core::{
    AdamStep, AttentionSpec, Backend, CrossAttentionSpec, DType, DeviceTensor, GemmSpec, HostBuffer,
    KvCacheAttentionSpec, Result, RotarySpec,
};

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }

    fn zeros(&self, shape: &[usize], dtype: DType) -> Result<DeviceTensor> {
        memory::zeros(shape, dtype)
    }
    fn from_host(&self, data: HostBuffer, shape: &[usize]) -> Result<DeviceTensor> {
        memory::from_host(data, shape)
    }
    fn to_host(&self, t: &DeviceTensor) -> Result<HostBuffer> {
        memory::to_host(t)
    }
    fn synchronize(&self) -> Result<()> {
        Ok(()) // every op has finished when it returns
    }
    fn copy(&self, src: &DeviceTensor, dst: &mut DeviceTensor) -> Result<()> {
        memory::copy(src, dst)
    }
    fn cast(&self, src: &DeviceTensor, dst: &mut DeviceTensor) -> Result<()> {
        self.run(|| memory::cast(src, dst))
    }

    fn fill(&self, t: &mut DeviceTensor, value: f32) -> Result<()> {
        self.run(|| elementwise::fill(t, value))
    }
    fn scale(&self, t: &mut DeviceTensor, s: f32) -> Result<()> {
        self.run(|| elementwise::scale(t, s))
    }
    fn axpy(&self, a: &mut DeviceTensor, alpha: f32, b: &DeviceTensor) -> Result<()> {
        self.run(|| elementwise::axpy(a, alpha, b))
    }
    fn add(&self, a: &DeviceTensor, b: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        self.run(|| elementwise::add(a, b, out))
    }
    fn sum_rows(&self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        self.run(|| {
            let mut o = Out::new(out, true)?;
            elementwise::sum_rows(x, o.t())?;
            o.finish()
        })
    }
    fn sum_squares(&self, x: &DeviceTensor) -> Result<f64> {
        self.run(|| elementwise::sum_squares(&*input(x)?))
    }
    fn abs_max(&self, x: &DeviceTensor) -> Result<(f32, bool)> {
        self.run(|| elementwise::abs_max(&*input(x)?))
    }

    fn gemm(
        &self,
        a: &DeviceTensor,
        b: &DeviceTensor,
        c: &mut DeviceTensor,
        spec: GemmSpec,
        bias: Option<&DeviceTensor>,
    ) -> Result<()> {
        let kernel = self.bf16_kernel();
        self.run(|| gemm::gemm_op(a, b, c, spec, bias, kernel))
    }
    fn grouped_gemm(
        &self,
        a: &DeviceTensor,
        b: &DeviceTensor,
        c: &mut DeviceTensor,
        groups: &[megatron_core::GemmGroup],
        spec: megatron_core::GroupedGemmSpec,
    ) -> Result<()> {
        self.run(|| crate::grouped_gemm::grouped_gemm_op(a, b, c, groups, spec))
    }

    fn layernorm_forward(
        &self,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        bias: Option<&DeviceTensor>,
        eps: f32,
        out: &mut DeviceTensor,
        mean: &mut DeviceTensor,
        rstd: &mut DeviceTensor,
    ) -> Result<()> {
        self.run(|| {
            let (x, weight, bias) = (input(x)?, input(weight)?, input_opt(bias)?);
            let mut o = Out::new(out, false)?;
            norm::layernorm_forward(&x, &weight, bias.as_deref(), eps, o.t(), mean, rstd)?;
            o.finish()
        })
    }
    fn layernorm_backward(
        &self,
        d_out: &DeviceTensor,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        mean: &DeviceTensor,
        rstd: &DeviceTensor,
        d_x: &mut DeviceTensor,
        d_weight: &mut DeviceTensor,
        d_bias: Option<&mut DeviceTensor>,
    ) -> Result<()> {
        self.run(|| {
            let (d_out, x, weight) = (input(d_out)?, input(x)?, input(weight)?);
            let mut dx = Out::new(d_x, false)?;
            let mut dw = Out::new(d_weight, true)?;
            let mut db = out_opt(d_bias, true)?;
            norm::layernorm_backward(&d_out, &x, &weight, mean, rstd, dx.t(), dw.t(), db.as_mut().map(|d| d.t()))?;
            dx.finish()?;
            dw.finish()?;
            db.map_or(Ok(()), Out::finish)
        })
    }
    fn rmsnorm_forward(
        &self,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        eps: f32,
        out: &mut DeviceTensor,
        rstd: &mut DeviceTensor,
    ) -> Result<()> {
        self.run(|| {
            let (x, weight) = (input(x)?, input(weight)?);
            let mut o = Out::new(out, false)?;
            norm::rmsnorm_forward(&x, &weight, eps, o.t(), rstd)?;
            o.finish()
        })
    }
    fn rmsnorm_backward(
        &self,
        d_out: &DeviceTensor,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        rstd: &DeviceTensor,
        d_x: &mut DeviceTensor,
        d_weight: &mut DeviceTensor,
    ) -> Result<()> {
        self.run(|| {
            let (d_out, x, weight) = (input(d_out)?, input(x)?, input(weight)?);
            let mut dx = Out::new(d_x, false)?;
            let mut dw = Out::new(d_weight, true)?;
            norm::rmsnorm_backward(&d_out, &x, &weight, rstd, dx.t(), dw.t())?;
            dx.finish()?;
            dw.finish()
        })
    }

    fn gelu_forward(&self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        self.run(|| activation::gelu_forward(x, out))
    }
    fn gelu_backward(&self, x: &DeviceTensor, d_out: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()> {
        self.run(|| activation::gelu_backward(x, d_out, d_x))
    }
    fn swiglu_forward(&self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        self.run(|| {
            let x = input(x)?;
            let mut o = Out::new(out, false)?;
            activation::swiglu_forward(&x, o.t())?;
            o.finish()
        })
    }
    fn swiglu_backward(&self, x: &DeviceTensor, d_out: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()> {
        self.run(|| {
            let (x, d_out) = (input(x)?, input(d_out)?);
            let mut o = Out::new(d_x, false)?;
            activation::swiglu_backward(&x, &d_out, o.t())?;
            o.finish()
        })
    }
    fn softmax_forward(&self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        self.run(|| {
            let x = input(x)?;
            let mut o = Out::new(out, false)?;
            activation::softmax_forward(&x, o.t())?;
            o.finish()
        })
    }
    fn softmax_backward(&self, y: &DeviceTensor, d_y: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()> {
        self.run(|| {
            let (y, d_y) = (input(y)?, input(d_y)?);
            let mut o = Out::new(d_x, false)?;
            activation::softmax_backward(&y, &d_y, o.t())?;
            o.finish()
        })
    }
    fn dropout(&self, x: &mut DeviceTensor, p: f32, seed: u64) -> Result<()> {
        self.run(|| elementwise::dropout(x, p, seed))
    }

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
    fn attention_kv_cache(
        &self,
        qkv: &DeviceTensor,
        k_cache: &mut DeviceTensor,
        v_cache: &mut DeviceTensor,
        key_start: Option<&DeviceTensor>,
        out: &mut DeviceTensor,
        spec: KvCacheAttentionSpec,
    ) -> Result<()> {
        self.run(|| {
            let qkv = input(qkv)?;
            let (mut kc, mut vc) = (Out::new(k_cache, true)?, Out::new(v_cache, true)?);
            let mut o = Out::new(out, false)?;
            kv_attention::attention_kv_cache(&qkv, kc.t(), vc.t(), key_start, o.t(), spec)?;
            kc.finish()?;
            vc.finish()?;
            o.finish()
        })
    }
    fn attention_kv_cache_slots(
        &self,
        qkv: &DeviceTensor,
        k_cache: &mut DeviceTensor,
        v_cache: &mut DeviceTensor,
        slots: &[usize],
        offsets: &[usize],
        out: &mut DeviceTensor,
        spec: KvCacheAttentionSpec,
    ) -> Result<()> {
        self.run(|| {
            let qkv = input(qkv)?;
            let (mut kc, mut vc) = (Out::new(k_cache, true)?, Out::new(v_cache, true)?);
            let mut o = Out::new(out, false)?;
            kv_slots::attention_kv_cache_slots(&qkv, kc.t(), vc.t(), slots, offsets, o.t(), spec)?;
            kc.finish()?;
            vc.finish()?;
            o.finish()
        })
    }
    fn rotary(&self, qkv: &mut DeviceTensor, spec: RotarySpec, inverse: bool) -> Result<()> {
        self.run(|| {
            let mut o = Out::new(qkv, true)?;
            rotary::rotary(o.t(), spec, inverse)?;
            o.finish()
        })
    }

    fn embedding_forward(
        &self,
        ids: &DeviceTensor,
        table: &DeviceTensor,
        row_start: usize,
        out: &mut DeviceTensor,
        accumulate: bool,
    ) -> Result<()> {
        self.run(|| {
            let table = input(table)?;
            let mut o = Out::new(out, accumulate)?;
            embedding::embedding_forward(ids, &table, row_start, o.t(), accumulate)?;
            o.finish()
        })
    }
    fn embedding_backward(
        &self,
        ids: &DeviceTensor,
        d_out: &DeviceTensor,
        row_start: usize,
        d_table: &mut DeviceTensor,
    ) -> Result<()> {
        self.run(|| {
            let d_out = input(d_out)?;
            let mut o = Out::new(d_table, true)?;
            embedding::embedding_backward(ids, &d_out, row_start, o.t())?;
            o.finish()
        })
    }
    fn row_max(&self, logits: &DeviceTensor, row_max: &mut DeviceTensor) -> Result<()> {
        self.run(|| loss::row_max(logits, row_max))
    }
    fn cross_entropy_stats(
        &self,
        logits: &DeviceTensor,
        targets: &DeviceTensor,
        vocab_start: usize,
        row_max: &DeviceTensor,
        sum_exp: &mut DeviceTensor,
        target_logit: &mut DeviceTensor,
    ) -> Result<()> {
        self.run(|| loss::cross_entropy_stats(logits, targets, vocab_start, row_max, sum_exp, target_logit))
    }
    fn cross_entropy_backward_inplace(
        &self,
        logits: &mut DeviceTensor,
        targets: &DeviceTensor,
        vocab_start: usize,
        row_max: &DeviceTensor,
        sum_exp: &DeviceTensor,
        d_loss: &DeviceTensor,
    ) -> Result<()> {
        self.run(|| loss::cross_entropy_backward_inplace(logits, targets, vocab_start, row_max, sum_exp, d_loss))
    }

    fn adam_step(
        &self,
        param: &mut DeviceTensor,
        grad: &DeviceTensor,
        exp_avg: &mut DeviceTensor,
        exp_avg_sq: &mut DeviceTensor,
        step: AdamStep,
    ) -> Result<()> {
        self.run(|| {
            let grad = input(grad)?;
            let mut p = Out::new(param, true)?;
            let (mut m, mut v) = (Out::new(exp_avg, true)?, Out::new(exp_avg_sq, true)?);
            optim::adam_step(p.t(), &grad, m.t(), v.t(), step)?;
            p.finish()?;
            m.finish()?;
            v.finish()
        })
    }
    fn sgd_step(
        &self,
        param: &mut DeviceTensor,
        grad: &DeviceTensor,
        momentum_buf: &mut DeviceTensor,
        lr: f32,
        momentum: f32,
        weight_decay: f32,
        first_step: bool,
    ) -> Result<()> {
        self.run(|| {
            let grad = input(grad)?;
            let (mut p, mut b) = (Out::new(param, true)?, Out::new(momentum_buf, true)?);
            optim::sgd_step(p.t(), &grad, b.t(), lr, momentum, weight_decay, first_step)?;
            p.finish()?;
            b.finish()
        })
    }

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

    fn rotary_scaled(
        &self,
        qkv: &mut DeviceTensor,
        spec: RotarySpec,
        scaling: megatron_core::RopeScaling,
        inverse: bool,
    ) -> Result<()> {
        self.run(|| {
            let mut o = Out::new(qkv, true)?;
            rotary::rotary_scaled(o.t(), spec, scaling, inverse)?;
            o.finish()
        })
    }
    // ---- Mamba-2 mixer ops (mamba/) ----------------------------------------------------------
    fn causal_conv1d_silu_forward(
        &self,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        bias: &DeviceTensor,
        out: &mut DeviceTensor,
        pre: &mut DeviceTensor,
        spec: megatron_core::Conv1dSpec,
    ) -> Result<()> {
        self.run(|| crate::mamba::conv::forward(x, weight, bias, out, pre, spec))
    }
    fn causal_conv1d_silu_backward(
        &self,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        pre: &DeviceTensor,
        d_out: &DeviceTensor,
        d_x: &mut DeviceTensor,
        d_weight: &mut DeviceTensor,
        d_bias: &mut DeviceTensor,
        spec: megatron_core::Conv1dSpec,
    ) -> Result<()> {
        self.run(|| crate::mamba::conv::backward(x, weight, pre, d_out, d_x, d_weight, d_bias, spec))
    }
    fn ssd_scan_forward(
        &self,
        inputs: megatron_core::SsdTensors,
        y: &mut DeviceTensor,
        states: &mut DeviceTensor,
        spec: megatron_core::SsdSpec,
    ) -> Result<()> {
        self.run(|| crate::mamba::ssd::forward(inputs, y, states, spec))
    }
    fn ssd_scan_backward(
        &self,
        inputs: megatron_core::SsdTensors,
        states: &DeviceTensor,
        dy: &DeviceTensor,
        grads: megatron_core::SsdGradTensors,
        spec: megatron_core::SsdSpec,
    ) -> Result<()> {
        self.run(|| crate::mamba::ssd_backward::backward(inputs, states, dy, grads, spec))
    }
    fn gated_rmsnorm_forward(
        &self,
        y: &DeviceTensor,
        z: &DeviceTensor,
        weight: &DeviceTensor,
        groups: usize,
        eps: f32,
        out: &mut DeviceTensor,
        rstd: &mut DeviceTensor,
    ) -> Result<()> {
        self.run(|| crate::mamba::gated_norm::forward(y, z, weight, groups, eps, out, rstd))
    }
    fn gated_rmsnorm_backward(
        &self,
        y: &DeviceTensor,
        z: &DeviceTensor,
        weight: &DeviceTensor,
        groups: usize,
        rstd: &DeviceTensor,
        d_out: &DeviceTensor,
        d_y: &mut DeviceTensor,
        d_z: &mut DeviceTensor,
        d_weight: &mut DeviceTensor,
    ) -> Result<()> {
        self.run(|| crate::mamba::gated_norm::backward(y, z, weight, groups, rstd, d_out, d_y, d_z, d_weight))
    }
}
