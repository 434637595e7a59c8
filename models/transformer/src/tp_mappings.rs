//! The tensor-parallel region mappings of SPEC §5.2 (Megatron's `mappings.py`), as explicit
//! forward and backward functions over `ctx.tp_group`. At tp = 1 the collectives are no-ops of
//! the communicator, but every call is kept so the TP code path is the one always run.

use anyhow::{Context, Result};
use megatron_core::{DeviceTensor, ParallelContext, ReduceOp};

/// copy-to-TP-region, forward: identity (the input is already replicated on every TP rank).
pub fn copy_to_tp_region_forward(_ctx: &ParallelContext, _x: &DeviceTensor) -> Result<()> {
    Ok(())
}

/// copy-to-TP-region, backward: each rank holds a partial input gradient; sum them.
pub fn copy_to_tp_region_backward(ctx: &ParallelContext, d_x: &mut DeviceTensor) -> Result<()> {
    ctx.comm
        .all_reduce(&ctx.tp_group, d_x, ReduceOp::Sum)
        .context("all-reduce of the input gradient of a column-parallel layer (copy-to-TP backward)")
}

/// reduce-from-TP-region, forward: sum the partial outputs of a row-parallel layer.
pub fn reduce_from_tp_region_forward(ctx: &ParallelContext, y: &mut DeviceTensor) -> Result<()> {
    ctx.comm
        .all_reduce(&ctx.tp_group, y, ReduceOp::Sum)
        .context("all-reduce of the output of a row-parallel layer (reduce-from-TP forward)")
}

/// reduce-from-TP-region, backward: identity (the output gradient is replicated).
pub fn reduce_from_tp_region_backward(_ctx: &ParallelContext, _d_y: &DeviceTensor) -> Result<()> {
    Ok(())
}

/// All-reduce with `op` over the TP group (vocab-parallel embedding and cross entropy).
pub fn all_reduce_tp(ctx: &ParallelContext, t: &mut DeviceTensor, op: ReduceOp, what: &str) -> Result<()> {
    ctx.comm.all_reduce(&ctx.tp_group, t, op).with_context(|| format!("tensor-parallel all-reduce of {what}"))
}
