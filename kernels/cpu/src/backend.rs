//! `impl Backend for CpuBackend`: every trait method validates through its module and runs
//! inside this backend's rayon pool.

use crate::{
    activation, attention, elementwise, embedding, gemm, kv_attention, loss, memory, norm, optim, rotary, CpuBackend,
};
use megatron_core::{
    AdamStep, AttentionSpec, Backend, DType, DeviceTensor, GemmSpec, HostBuffer, KvCacheAttentionSpec, Result,
    RotarySpec,
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
        memory::cast(src, dst)
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
        self.run(|| elementwise::sum_rows(x, out))
    }
    fn sum_squares(&self, x: &DeviceTensor) -> Result<f64> {
        self.run(|| elementwise::sum_squares(x))
    }
    fn abs_max(&self, x: &DeviceTensor) -> Result<(f32, bool)> {
        self.run(|| elementwise::abs_max(x))
    }

    fn gemm(
        &self,
        a: &DeviceTensor,
        b: &DeviceTensor,
        c: &mut DeviceTensor,
        spec: GemmSpec,
        bias: Option<&DeviceTensor>,
    ) -> Result<()> {
        self.run(|| gemm::gemm_op(a, b, c, spec, bias))
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
        self.run(|| norm::layernorm_forward(x, weight, bias, eps, out, mean, rstd))
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
        self.run(|| norm::layernorm_backward(d_out, x, weight, mean, rstd, d_x, d_weight, d_bias))
    }
    fn rmsnorm_forward(
        &self,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        eps: f32,
        out: &mut DeviceTensor,
        rstd: &mut DeviceTensor,
    ) -> Result<()> {
        self.run(|| norm::rmsnorm_forward(x, weight, eps, out, rstd))
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
        self.run(|| norm::rmsnorm_backward(d_out, x, weight, rstd, d_x, d_weight))
    }

    fn gelu_forward(&self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        self.run(|| activation::gelu_forward(x, out))
    }
    fn gelu_backward(&self, x: &DeviceTensor, d_out: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()> {
        self.run(|| activation::gelu_backward(x, d_out, d_x))
    }
    fn swiglu_forward(&self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        self.run(|| activation::swiglu_forward(x, out))
    }
    fn swiglu_backward(&self, x: &DeviceTensor, d_out: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()> {
        self.run(|| activation::swiglu_backward(x, d_out, d_x))
    }
    fn softmax_forward(&self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        self.run(|| activation::softmax_forward(x, out))
    }
    fn softmax_backward(&self, y: &DeviceTensor, d_y: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()> {
        self.run(|| activation::softmax_backward(y, d_y, d_x))
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
        self.run(|| attention::attention_forward(qkv, out, lse, spec))
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
        self.run(|| attention::attention_backward(d_out, qkv, out, lse, d_qkv, spec))
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
        self.run(|| kv_attention::attention_kv_cache(qkv, k_cache, v_cache, key_start, out, spec))
    }
    fn rotary(&self, qkv: &mut DeviceTensor, spec: RotarySpec, inverse: bool) -> Result<()> {
        self.run(|| rotary::rotary(qkv, spec, inverse))
    }

    fn embedding_forward(
        &self,
        ids: &DeviceTensor,
        table: &DeviceTensor,
        row_start: usize,
        out: &mut DeviceTensor,
        accumulate: bool,
    ) -> Result<()> {
        self.run(|| embedding::embedding_forward(ids, table, row_start, out, accumulate))
    }
    fn embedding_backward(
        &self,
        ids: &DeviceTensor,
        d_out: &DeviceTensor,
        row_start: usize,
        d_table: &mut DeviceTensor,
    ) -> Result<()> {
        self.run(|| embedding::embedding_backward(ids, d_out, row_start, d_table))
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
        self.run(|| optim::adam_step(param, grad, exp_avg, exp_avg_sq, step))
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
        self.run(|| optim::sgd_step(param, grad, momentum_buf, lr, momentum, weight_decay, first_step))
    }
}
