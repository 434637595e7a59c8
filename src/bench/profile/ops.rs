//! The op forwarders of [`ProfilingBackend`]: one impl per op family of [`megatron_core::Backend`],
//! each op timed under its name; here the dense ops, attention and sequence mixers in
//! `sequence_ops.rs`. Every op is forwarded, defaulted ones included: a missing forwarder
//! would run the trait default (a host round trip or an error) instead of the inner backend's kernel.

use super::{dtypes, ProfilingBackend, T};
use megatron_core::{
    ActivationOps, AdamStep, DType, ElementwiseOps, EmbeddingLossOps, GemmOps, GemmSpec, HostBuffer, MemoryOps,
    NormOps, OptimizerOps, Result,
};

impl MemoryOps for ProfilingBackend {
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
}

impl ElementwiseOps for ProfilingBackend {
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
}

impl GemmOps for ProfilingBackend {
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
    fn grouped_gemm(
        &self,
        a: &T,
        x: &T,
        c: &mut T,
        groups: &[megatron_core::GemmGroup],
        spec: megatron_core::GroupedGemmSpec,
    ) -> Result<()> {
        self.timed(format!("grouped_gemm {}", dtypes(&[a, x], c)), |b| b.grouped_gemm(a, x, c, groups, spec))
    }
}

impl NormOps for ProfilingBackend {
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
}

impl ActivationOps for ProfilingBackend {
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
}

impl EmbeddingLossOps for ProfilingBackend {
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
}

impl OptimizerOps for ProfilingBackend {
    fn adam_step(&self, p: &mut T, g: &T, m: &mut T, v: &mut T, step: AdamStep) -> Result<()> {
        self.timed("adam_step", |b| b.adam_step(p, g, m, v, step))
    }
    fn sgd_step(&self, p: &mut T, g: &T, buf: &mut T, lr: f32, mom: f32, wd: f32, first: bool) -> Result<()> {
        self.timed("sgd_step", |b| b.sgd_step(p, g, buf, lr, mom, wd, first))
    }
}

#[cfg(test)]
mod tests {
    /// The `fn` names at the first indentation level of `source` (trait or impl items).
    fn item_fns(source: &str) -> Vec<String> {
        let name = |rest: &str| {
            rest[..rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len())].to_string()
        };
        source.lines().filter_map(|l| l.strip_prefix("    fn ")).map(name).collect()
    }

    /// Every op of every family trait in `core/src/backend/` has a forwarder here: one missing
    /// would time nothing and run the trait's default instead of the inner backend's kernel.
    #[test]
    fn every_backend_op_is_forwarded() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("core/src/backend");
        let mut ops = Vec::new();
        for entry in std::fs::read_dir(&dir).expect("core/src/backend") {
            let path = entry.expect("dir entry").path();
            ops.extend(item_fns(&std::fs::read_to_string(&path).expect("a family file")));
        }
        let mut forwarded = item_fns(include_str!("ops.rs"));
        forwarded.extend(item_fns(include_str!("sequence_ops.rs")));
        forwarded.retain(|f| f != "item_fns" && f != "every_backend_op_is_forwarded");
        ops.sort();
        forwarded.sort();
        assert!(ops.len() > 50, "found only {} ops in {}", ops.len(), dir.display());
        let missing: Vec<_> = ops.iter().filter(|o| !forwarded.contains(o)).collect();
        let extra: Vec<_> = forwarded.iter().filter(|f| !ops.contains(f)).collect();
        assert!(missing.is_empty() && extra.is_empty(), "ProfilingBackend misses {missing:?}, has no op for {extra:?}");
    }
}
