//! Sequence parallelism (`--sequence-parallel`, SPEC §5.3): outside the tensor-parallel regions
//! (norms, dropouts, residual adds) every TP rank keeps only its shard of the tokens, and the
//! all-reduces of SPEC §5.2 become an all-gather entering each column-parallel linear and a
//! reduce-scatter leaving each row-parallel linear (the SP mappings of the §5.2 table).
//!
//! The shard. Megatron's activations are `[s, b, h]`, so a split of dim 0 is a sequence split
//! and one contiguous block of rows. Ours are `(B, T, C)`: the shard of TP rank `r` is the
//! contiguous block `[r·N/tp, (r+1)·N/tp)` of the `N = B·T` flattened token rows, kept as
//! `(N/tp, C)`. At `B = 1` that is exactly Megatron's sequence shard; for `B > 1` it is a
//! block of whole rows and positions, the same size. Every op outside the TP regions is per
//! token, so which tokens a rank holds changes nothing but the memory, and the collectives are
//! the communicator's dim-0 all-gather / reduce-scatter with no relayout. Megatron requires
//! `s % tp == 0`; we require `T % tp == 0` too (which makes `N % tp == 0`).
//!
//! The sequence-parallel linears keep only their `(N/tp, ·)` input shard for backward and
//! gather it again there, as Megatron does, so the gathered `(N, ·)` tensors are temporaries,
//! never saved activations. The bias of a row-parallel layer is added on the shard after the
//! reduce-scatter, so its gradient (like the norms') is partial on each rank and is summed over
//! TP in the gradient finalize (SPEC §5.10 step 2, [`is_sequence_parallel_param`]).
//!
//! Precision (`--bf16` / `--fp16`). Every gathered or reduce-scattered temporary takes the
//! dtype of the shard it comes from or goes to, so the collectives move the model's dtype, as
//! Megatron's do (fp32 for the residual stream under `--fp32-residual-connection`). The
//! row-parallel partial sums are rounded to that dtype before the reduce-scatter, where the
//! plain row-parallel layer rounds them before its all-reduce, and the communicator adds half
//! inputs in fp32 and rounds once for both collectives: a sequence-parallel step is the plain
//! TP step's arithmetic, bit for bit, except the fp32 summation order of the replicated
//! parameters' gradients (models/gpt/tests/sp_half_parity.rs). Reducing in fp32 here would be
//! slightly more accurate but would make SP differ from plain TP; we keep Megatron's placement.

use crate::init::ModuleBuilder;
use crate::linear::{
    linear_backward, linear_forward, ColumnParallelLinear, LinearConfig, LinearLayer, RowParallelLinear,
};
use anyhow::{bail, Context, Result};
use megatron_core::{Backend, DType, DeviceTensor, GemmSpec, HostBuffer, ParallelContext, Param, ReduceOp};
use std::sync::Arc;

/// Rows of this rank's shard of `tokens` token rows; errors name the flags when it does not
/// divide.
pub fn shard_rows(ctx: &ParallelContext, tokens: usize) -> Result<usize> {
    let tp = ctx.tp_size();
    if !tokens.is_multiple_of(tp) {
        bail!(
            "--sequence-parallel splits the {tokens} tokens of a microbatch over --tensor-model-parallel-size {tp}; \
             choose --seq-length divisible by it"
        );
    }
    Ok(tokens / tp)
}

/// gather-from-SP-region, forward: `full (N, C)` = the TP group's shards `(N/tp, C)` in rank
/// order. Also the backward of reduce-scatter-to-SP-region and scatter-to-SP-region.
pub fn gather_from_sp_region(ctx: &ParallelContext, shard: &DeviceTensor, full: &mut DeviceTensor) -> Result<()> {
    ctx.comm.all_gather(&ctx.tp_group, shard, full).context("sequence-parallel all-gather over the TP group")
}

/// reduce-scatter-to-SP-region, forward: `shard (N/tp, C)` = this rank's rows of the sum of
/// every rank's `full (N, C)`. Also the backward of gather-from-SP-region.
pub fn reduce_scatter_to_sp_region(ctx: &ParallelContext, full: &DeviceTensor, shard: &mut DeviceTensor) -> Result<()> {
    ctx.comm
        .reduce_scatter(&ctx.tp_group, full, shard, ReduceOp::Sum)
        .context("sequence-parallel reduce-scatter over the TP group")
}

/// A zero `(rows, cols)` temporary in `dtype` (the gathered tensors live only inside one
/// call). It always takes the dtype of the shard it is gathered from or scattered into, so
/// the collectives move the model's activation dtype (bf16/fp16 in a half model, fp32 with
/// `--fp32-residual-connection` for the residual stream), as Megatron's do.
fn temp(backend: &dyn Backend, rows: usize, cols: usize, dtype: DType) -> Result<DeviceTensor> {
    backend.zeros(&[rows, cols], dtype)
}

/// Parameters replicated over TP whose gradient is computed from this rank's token shard
/// only under sequence parallelism: norm weights/biases and row-parallel biases inside the
/// decoder (Megatron's `sequence_parallel` attribute). The caller passes the decoder's params.
pub fn is_sequence_parallel_param(p: &Param) -> bool {
    p.layout.tp_axis.is_none()
}

/// SUM all-reduce over TP of the gradients of `params` that [`is_sequence_parallel_param`]
/// selects (SPEC §5.10 step 2), in the given order. Experts sharded over an expert grid that
/// spans the TP ranks are different tensors on each TP rank (reduced over their
/// expert-data-parallel group instead), so they are left out.
pub fn all_reduce_sequence_parallel_grads(ctx: &ParallelContext, params: Vec<&mut Param>) -> Result<()> {
    let sharded_expert = |p: &Param| p.layout.expert_parallel && ctx.experts_sharded();
    for p in params.into_iter().filter(|p| is_sequence_parallel_param(p) && !sharded_expert(p)) {
        ctx.comm
            .all_reduce(&ctx.tp_group, &mut p.grad, ReduceOp::Sum)
            .with_context(|| format!("sequence-parallel all-reduce over TP of the gradient of {}", p.name))?;
    }
    Ok(())
}

/// [`ColumnParallelLinear`] on a sequence-parallel input: `x (N/tp, in)` is all-gathered to
/// `(N, in)` before the gemm; backward gathers it again for the weight gradient and
/// reduce-scatters the `(N, in)` input gradient back to `(N/tp, in)`.
pub struct SequenceParallelColumnLinear {
    backend: Arc<dyn Backend>,
    ctx: ParallelContext,
    inner: ColumnParallelLinear,
}

impl SequenceParallelColumnLinear {
    pub fn new(b: &ModuleBuilder, prefix: &str, cfg: LinearConfig) -> Result<Self> {
        Ok(Self { backend: b.backend.clone(), ctx: b.ctx.clone(), inner: ColumnParallelLinear::new(b, prefix, cfg)? })
    }

    fn gather(&self, x: &DeviceTensor) -> Result<DeviceTensor> {
        let cols = self.inner.weight.value.shape()[1];
        let mut full = temp(self.backend.as_ref(), x.numel() / cols.max(1) * self.ctx.tp_size(), cols, x.dtype())?;
        gather_from_sp_region(&self.ctx, x, &mut full)?;
        Ok(full)
    }
}

impl LinearLayer for SequenceParallelColumnLinear {
    fn forward(&mut self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        let full = self.gather(x)?; // (N, in)
        let bias = self.inner.bias.as_ref().map(|b| &b.value);
        linear_forward(self.backend.as_ref(), &full, &self.inner.weight.value, bias, out)
    }

    fn backward(&mut self, x: &DeviceTensor, d_out: &DeviceTensor, d_x: Option<&mut DeviceTensor>) -> Result<()> {
        let full = self.gather(x)?; // (N, in), gathered again rather than kept
        let bk = self.backend.as_ref();
        let w = &mut self.inner.weight;
        let d_b = self.inner.bias.as_mut().map(|b| &mut b.grad);
        match d_x {
            Some(d_x) => {
                let mut d_full = temp(bk, full.shape()[0], full.shape()[1], d_x.dtype())?; // (N, in)
                linear_backward(bk, &full, &w.value, d_out, Some(&mut d_full), &mut w.grad, d_b)?;
                reduce_scatter_to_sp_region(&self.ctx, &d_full, d_x)
            }
            None => linear_backward(bk, &full, &w.value, d_out, None, &mut w.grad, d_b),
        }
    }

    fn local_features(&self) -> (usize, usize) {
        self.inner.local_features()
    }

    fn params(&self) -> Vec<&Param> {
        self.inner.params()
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        self.inner.params_mut()
    }
}

/// [`RowParallelLinear`] with a sequence-parallel output: the `(N, out)` partial sums are
/// reduce-scattered to this rank's `(N/tp, out)` shard and the bias is added there; backward
/// all-gathers the output gradient. The bias gradient is this shard's part (summed over TP in
/// the gradient finalize).
pub struct SequenceParallelRowLinear {
    backend: Arc<dyn Backend>,
    ctx: ParallelContext,
    inner: RowParallelLinear,
    ones: DeviceTensor, // (N/tp, 1): adds the bias as a rank-1 gemm
}

impl SequenceParallelRowLinear {
    pub fn new(b: &ModuleBuilder, prefix: &str, cfg: LinearConfig) -> Result<Self> {
        Ok(Self {
            backend: b.backend.clone(),
            ctx: b.ctx.clone(),
            inner: RowParallelLinear::new(b, prefix, cfg)?,
            ones: crate::step::empty(b.backend.as_ref())?,
        })
    }
}

impl LinearLayer for SequenceParallelRowLinear {
    fn forward(&mut self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        let bk = self.backend.as_ref();
        let n_out = self.inner.weight.value.shape()[0];
        let rows = out.numel() / n_out.max(1);
        // The partial sums are rounded into the output's dtype before the reduce-scatter, as the
        // non-SP row-parallel layer rounds them before its all-reduce (the communicator then
        // adds the half partials in fp32 and rounds once).
        let mut partial = temp(bk, rows * self.ctx.tp_size(), n_out, out.dtype())?; // (N, out)
        linear_forward(bk, x, &self.inner.weight.value, None, &mut partial)?;
        reduce_scatter_to_sp_region(&self.ctx, &partial, out)?;
        if let Some(bias) = self.inner.bias.as_ref() {
            if self.ones.shape() != [rows, 1] {
                self.ones = bk.from_host(HostBuffer::F32(vec![1.0; rows]), &[rows, 1])?;
            }
            let spec = GemmSpec { m: rows, n: n_out, k: 1, trans_a: false, trans_b: false, alpha: 1.0, beta: 1.0 };
            bk.gemm(&self.ones, &bias.value, out, spec, None)?;
        }
        Ok(())
    }

    fn backward(&mut self, x: &DeviceTensor, d_out: &DeviceTensor, d_x: Option<&mut DeviceTensor>) -> Result<()> {
        let bk = self.backend.as_ref();
        let n_out = self.inner.weight.value.shape()[0];
        let mut d_full = temp(bk, d_out.numel() / n_out.max(1) * self.ctx.tp_size(), n_out, d_out.dtype())?; // (N, out)
        gather_from_sp_region(&self.ctx, d_out, &mut d_full)?;
        let w = &mut self.inner.weight;
        linear_backward(bk, x, &w.value, &d_full, d_x, &mut w.grad, None)?;
        if let Some(b) = self.inner.bias.as_mut() {
            bk.sum_rows(d_out, &mut b.grad)?;
        }
        Ok(())
    }

    fn local_features(&self) -> (usize, usize) {
        self.inner.local_features()
    }

    fn params(&self) -> Vec<&Param> {
        self.inner.params()
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        self.inner.params_mut()
    }
}
