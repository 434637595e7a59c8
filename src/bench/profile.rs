//! A [`Backend`] decorator that times every op (synchronising after each) to give the per-op
//! profile of `megatron bench`. It adds one `synchronize` per op, which is free on the CPU.

use megatron_core::{
    AdamStep, AttentionSpec, Backend, DType, DeviceTensor, GemmSpec, HostBuffer, KvCacheAttentionSpec, Result,
    RotarySpec,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Wraps a backend; [`ProfilingBackend::report`] gives `(op, calls, seconds)` sorted by time
/// (GEMMs keyed by `m x n x k` and transposes).
pub struct ProfilingBackend {
    inner: Arc<dyn Backend>,
    times: Mutex<BTreeMap<String, (u64, f64)>>,
}

impl ProfilingBackend {
    pub fn new(inner: Arc<dyn Backend>) -> ProfilingBackend {
        ProfilingBackend { inner, times: Mutex::new(BTreeMap::new()) }
    }

    fn timed<T>(&self, op: impl Into<String>, f: impl FnOnce(&dyn Backend) -> Result<T>) -> Result<T> {
        let t = Instant::now();
        let out = f(self.inner.as_ref())?;
        self.inner.synchronize()?;
        let dt = t.elapsed().as_secs_f64();
        if let Ok(mut m) = self.times.lock() {
            let e = m.entry(op.into()).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += dt;
        }
        Ok(out)
    }

    pub fn reset(&self) {
        if let Ok(mut m) = self.times.lock() {
            m.clear();
        }
    }

    pub fn report(&self) -> Vec<(String, u64, f64)> {
        let m = self.times.lock().map(|m| m.clone()).unwrap_or_default();
        let mut v: Vec<_> = m.into_iter().map(|(k, (n, s))| (k, n, s)).collect();
        v.sort_by(|a, b| b.2.total_cmp(&a.2));
        v
    }
}

type T = DeviceTensor;

/// `a,b->c` dtypes of an op (mixed precision runs the same op in several dtype combinations).
fn dtypes(ins: &[&T], out: &T) -> String {
    let ins: Vec<String> = ins.iter().map(|t| t.dtype().to_string()).collect();
    format!("{}->{}", ins.join(","), out.dtype())
}

impl Backend for ProfilingBackend {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn zeros(&self, shape: &[usize], dtype: DType) -> Result<T> {
        self.timed("zeros", |b| b.zeros(shape, dtype))
    }
    fn from_host(&self, data: HostBuffer, shape: &[usize]) -> Result<T> {
        self.timed("from_host", |b| b.from_host(data, shape))
    }
    fn to_host(&self, t: &T) -> Result<HostBuffer> {
        self.timed("to_host", |b| b.to_host(t))
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    fn copy(&self, src: &T, dst: &mut T) -> Result<()> {
        self.timed("copy", |b| b.copy(src, dst))
    }
    fn cast(&self, src: &T, dst: &mut T) -> Result<()> {
        self.timed(format!("cast {}", dtypes(&[src], dst)), |b| b.cast(src, dst))
    }
    fn fill(&self, t: &mut T, value: f32) -> Result<()> {
        self.timed("fill", |b| b.fill(t, value))
    }
    fn scale(&self, t: &mut T, s: f32) -> Result<()> {
        self.timed("scale", |b| b.scale(t, s))
    }
    fn axpy(&self, a: &mut T, alpha: f32, x: &T) -> Result<()> {
        self.timed("axpy", |b| b.axpy(a, alpha, x))
    }
    fn add(&self, a: &T, x: &T, out: &mut T) -> Result<()> {
        self.timed("add", |b| b.add(a, x, out))
    }
    fn sum_rows(&self, x: &T, out: &mut T) -> Result<()> {
        self.timed("sum_rows", |b| b.sum_rows(x, out))
    }
    fn sum_squares(&self, x: &T) -> Result<f64> {
        self.timed("sum_squares", |b| b.sum_squares(x))
    }
    fn abs_max(&self, x: &T) -> Result<(f32, bool)> {
        self.timed("abs_max", |b| b.abs_max(x))
    }
    fn gemm(&self, a: &T, x: &T, c: &mut T, spec: GemmSpec, bias: Option<&T>) -> Result<()> {
        // Per shape and transpose: the GEMMs of a model run at very different rates.
        let t = |x: bool| if x { 'T' } else { 'N' };
        let op = format!(
            "gemm {}x{}x{} {}{} {}",
            spec.m,
            spec.n,
            spec.k,
            t(spec.trans_a),
            t(spec.trans_b),
            dtypes(&[a, x], c)
        );
        self.timed(op, |b| b.gemm(a, x, c, spec, bias))
    }
    fn layernorm_forward(
        &self,
        x: &T,
        w: &T,
        bias: Option<&T>,
        eps: f32,
        out: &mut T,
        mean: &mut T,
        rstd: &mut T,
    ) -> Result<()> {
        self.timed("layernorm_forward", |b| b.layernorm_forward(x, w, bias, eps, out, mean, rstd))
    }
    fn layernorm_backward(
        &self,
        d_out: &T,
        x: &T,
        w: &T,
        mean: &T,
        rstd: &T,
        d_x: &mut T,
        d_w: &mut T,
        d_b: Option<&mut T>,
    ) -> Result<()> {
        self.timed("layernorm_backward", |b| b.layernorm_backward(d_out, x, w, mean, rstd, d_x, d_w, d_b))
    }
    fn rmsnorm_forward(&self, x: &T, w: &T, eps: f32, out: &mut T, rstd: &mut T) -> Result<()> {
        self.timed("rmsnorm_forward", |b| b.rmsnorm_forward(x, w, eps, out, rstd))
    }
    fn rmsnorm_backward(&self, d_out: &T, x: &T, w: &T, rstd: &T, d_x: &mut T, d_w: &mut T) -> Result<()> {
        self.timed("rmsnorm_backward", |b| b.rmsnorm_backward(d_out, x, w, rstd, d_x, d_w))
    }
    fn gelu_forward(&self, x: &T, out: &mut T) -> Result<()> {
        self.timed("gelu_forward", |b| b.gelu_forward(x, out))
    }
    fn gelu_backward(&self, x: &T, d_out: &T, d_x: &mut T) -> Result<()> {
        self.timed("gelu_backward", |b| b.gelu_backward(x, d_out, d_x))
    }
    fn swiglu_forward(&self, x: &T, out: &mut T) -> Result<()> {
        self.timed("swiglu_forward", |b| b.swiglu_forward(x, out))
    }
    fn swiglu_backward(&self, x: &T, d_out: &T, d_x: &mut T) -> Result<()> {
        self.timed("swiglu_backward", |b| b.swiglu_backward(x, d_out, d_x))
    }
    fn softmax_forward(&self, x: &T, out: &mut T) -> Result<()> {
        self.timed("softmax_forward", |b| b.softmax_forward(x, out))
    }
    fn softmax_backward(&self, y: &T, d_y: &T, d_x: &mut T) -> Result<()> {
        self.timed("softmax_backward", |b| b.softmax_backward(y, d_y, d_x))
    }
    fn dropout(&self, x: &mut T, p: f32, seed: u64) -> Result<()> {
        self.timed("dropout", |b| b.dropout(x, p, seed))
    }
    fn attention_forward(&self, qkv: &T, out: &mut T, lse: &mut T, spec: AttentionSpec) -> Result<()> {
        self.timed("attention_forward", |b| b.attention_forward(qkv, out, lse, spec))
    }
    fn attention_kv_cache(
        &self,
        qkv: &T,
        k_cache: &mut T,
        v_cache: &mut T,
        key_start: Option<&T>,
        out: &mut T,
        spec: KvCacheAttentionSpec,
    ) -> Result<()> {
        self.timed("attention_kv_cache", |b| b.attention_kv_cache(qkv, k_cache, v_cache, key_start, out, spec))
    }
    fn attention_kv_cache_slots(
        &self,
        qkv: &T,
        k_cache: &mut T,
        v_cache: &mut T,
        slots: &[usize],
        offsets: &[usize],
        out: &mut T,
        spec: KvCacheAttentionSpec,
    ) -> Result<()> {
        self.timed("attention_kv_cache_slots", |b| {
            b.attention_kv_cache_slots(qkv, k_cache, v_cache, slots, offsets, out, spec)
        })
    }
    fn attention_backward(
        &self,
        d_out: &T,
        qkv: &T,
        out: &T,
        lse: &T,
        d_qkv: &mut T,
        spec: AttentionSpec,
    ) -> Result<()> {
        self.timed("attention_backward", |b| b.attention_backward(d_out, qkv, out, lse, d_qkv, spec))
    }
    fn rotary(&self, qkv: &mut T, spec: RotarySpec, inverse: bool) -> Result<()> {
        self.timed("rotary", |b| b.rotary(qkv, spec, inverse))
    }
    fn embedding_forward(&self, ids: &T, table: &T, row_start: usize, out: &mut T, accumulate: bool) -> Result<()> {
        self.timed("embedding_forward", |b| b.embedding_forward(ids, table, row_start, out, accumulate))
    }
    fn embedding_backward(&self, ids: &T, d_out: &T, row_start: usize, d_table: &mut T) -> Result<()> {
        self.timed("embedding_backward", |b| b.embedding_backward(ids, d_out, row_start, d_table))
    }
    fn row_max(&self, logits: &T, row_max: &mut T) -> Result<()> {
        self.timed("row_max", |b| b.row_max(logits, row_max))
    }
    fn cross_entropy_stats(
        &self,
        logits: &T,
        targets: &T,
        vs: usize,
        row_max: &T,
        sum_exp: &mut T,
        tl: &mut T,
    ) -> Result<()> {
        self.timed("cross_entropy_stats", |b| b.cross_entropy_stats(logits, targets, vs, row_max, sum_exp, tl))
    }
    fn cross_entropy_backward_inplace(
        &self,
        logits: &mut T,
        targets: &T,
        vs: usize,
        row_max: &T,
        sum_exp: &T,
        d_loss: &T,
    ) -> Result<()> {
        self.timed("cross_entropy_backward", |b| {
            b.cross_entropy_backward_inplace(logits, targets, vs, row_max, sum_exp, d_loss)
        })
    }
    fn adam_step(&self, p: &mut T, g: &T, m: &mut T, v: &mut T, step: AdamStep) -> Result<()> {
        self.timed("adam_step", |b| b.adam_step(p, g, m, v, step))
    }
    fn sgd_step(&self, p: &mut T, g: &T, buf: &mut T, lr: f32, mom: f32, wd: f32, first: bool) -> Result<()> {
        self.timed("sgd_step", |b| b.sgd_step(p, g, buf, lr, mom, wd, first))
    }

    // Context parallelism's ring-attention blocks and the Mamba-2 ops, passed through timed.
    #[allow(clippy::too_many_arguments)]
    fn attention_block_forward(
        &self,
        q: &T,
        k: &T,
        v: &T,
        q_pos: &T,
        k_pos: &T,
        out: &mut T,
        lse: &mut T,
        spec: megatron_core::AttentionBlockSpec,
    ) -> Result<()> {
        self.timed("attention_block_forward", |b| b.attention_block_forward(q, k, v, q_pos, k_pos, out, lse, spec))
    }
    fn attention_lse_merge(
        &self,
        out: &mut T,
        lse: &mut T,
        block_out: &T,
        block_lse: &T,
        spec: megatron_core::AttentionBlockSpec,
    ) -> Result<()> {
        self.timed("attention_lse_merge", |b| b.attention_lse_merge(out, lse, block_out, block_lse, spec))
    }
    #[allow(clippy::too_many_arguments)]
    fn attention_block_backward(
        &self,
        d_out: &T,
        q: &T,
        k: &T,
        v: &T,
        q_pos: &T,
        k_pos: &T,
        lse: &T,
        delta: &T,
        dq: &mut T,
        dk: &mut T,
        dv: &mut T,
        spec: megatron_core::AttentionBlockSpec,
    ) -> Result<()> {
        self.timed("attention_block_backward", |b| {
            b.attention_block_backward(d_out, q, k, v, q_pos, k_pos, lse, delta, dq, dk, dv, spec)
        })
    }
    fn causal_conv1d_silu_forward(
        &self,
        x: &T,
        weight: &T,
        bias: &T,
        out: &mut T,
        pre: &mut T,
        spec: megatron_core::Conv1dSpec,
    ) -> Result<()> {
        self.timed("causal_conv1d_silu_forward", |b| b.causal_conv1d_silu_forward(x, weight, bias, out, pre, spec))
    }
    #[allow(clippy::too_many_arguments)]
    fn causal_conv1d_silu_backward(
        &self,
        x: &T,
        weight: &T,
        pre: &T,
        d_out: &T,
        d_x: &mut T,
        d_weight: &mut T,
        d_bias: &mut T,
        spec: megatron_core::Conv1dSpec,
    ) -> Result<()> {
        self.timed("causal_conv1d_silu_backward", |b| {
            b.causal_conv1d_silu_backward(x, weight, pre, d_out, d_x, d_weight, d_bias, spec)
        })
    }
    fn ssd_scan_forward(
        &self,
        inputs: megatron_core::SsdTensors,
        y: &mut T,
        states: &mut T,
        spec: megatron_core::SsdSpec,
    ) -> Result<()> {
        self.timed("ssd_scan_forward", |b| b.ssd_scan_forward(inputs, y, states, spec))
    }
    fn ssd_scan_backward(
        &self,
        inputs: megatron_core::SsdTensors,
        states: &T,
        dy: &T,
        grads: megatron_core::SsdGradTensors,
        spec: megatron_core::SsdSpec,
    ) -> Result<()> {
        self.timed("ssd_scan_backward", |b| b.ssd_scan_backward(inputs, states, dy, grads, spec))
    }
    #[allow(clippy::too_many_arguments)]
    fn gated_rmsnorm_forward(
        &self,
        y: &T,
        z: &T,
        weight: &T,
        groups: usize,
        eps: f32,
        out: &mut T,
        rstd: &mut T,
    ) -> Result<()> {
        self.timed("gated_rmsnorm_forward", |b| b.gated_rmsnorm_forward(y, z, weight, groups, eps, out, rstd))
    }
    #[allow(clippy::too_many_arguments)]
    fn gated_rmsnorm_backward(
        &self,
        y: &T,
        z: &T,
        weight: &T,
        groups: usize,
        rstd: &T,
        d_out: &T,
        d_y: &mut T,
        d_z: &mut T,
        d_weight: &mut T,
    ) -> Result<()> {
        self.timed("gated_rmsnorm_backward", |b| {
            b.gated_rmsnorm_backward(y, z, weight, groups, rstd, d_out, d_y, d_z, d_weight)
        })
    }
}
