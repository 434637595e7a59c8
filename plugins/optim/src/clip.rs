//! Global gradient norm, clipping and the inf/NaN check (SPEC §6.6, §6.7).
//!
//! The norm is global over the model: squares of this rank's grads, all-reduced over the
//! model-parallel (TP×PP) group. Grads replicated over TP are identical on every TP rank, so
//! only TP rank 0 counts them; a pipeline stage's copy of a parameter held by another stage
//! (`ParamLayout::shared_copy`, the tied embedding on the last stage) is counted on the
//! original only (SPEC §6.6). Sharded expert weights (`ParamLayout::expert_parallel` with
//! ep · etp > 1) are held by one rank of the stage's expert grid each: their squares are summed
//! over the pipeline group and the expert-model-parallel (etp × ep) group instead, and the inf
//! check also reduces over that group.

use anyhow::Result;
use megatron_core::{Backend, Group, ParallelContext, Param, ReduceOp};

/// Whether `p`'s gradient belongs in this rank's share of the global norm.
fn counts_on_this_rank(p: &Param, ctx: &ParallelContext) -> bool {
    !p.layout.shared_copy && (p.layout.tp_axis.is_some() || ctx.tp_rank == 0)
}

/// The global L2 norm `sqrt(Σ g²)` of the gradients of `params`, identical on every rank of
/// the model-parallel group. Inf/NaN in any grad gives a non-finite norm.
pub fn grad_norm(params: &[&Param], backend: &dyn Backend, ctx: &ParallelContext) -> Result<f64> {
    grad_norm_sharded(params, backend, ctx, None)
}

/// [`grad_norm`] when each data-parallel rank holds only its shard of the reduced gradients
/// (zeros elsewhere; the distributed optimizer): the squares are also summed over `dp_group`.
pub fn grad_norm_sharded(
    params: &[&Param],
    backend: &dyn Backend,
    ctx: &ParallelContext,
    dp_group: Option<&Group>,
) -> Result<f64> {
    let mut sum = [0.0f64];
    // Expert parallelism: each rank of the stage's expert grid holds only its experts (or its
    // expert-TP slice of them, whole or not on this TP rank), whose squares are summed over
    // the pipeline and expert-model-parallel groups (Megatron's expert norm, SPEC §5.8).
    let split_experts = ctx.experts_sharded();
    let mut experts = [0.0f64];
    for p in params {
        if split_experts && p.layout.expert_parallel {
            experts[0] += backend.sum_squares(&p.grad)?;
        } else if counts_on_this_rank(p, ctx) {
            sum[0] += backend.sum_squares(&p.grad)?;
        }
    }
    ctx.comm.all_reduce_f64(&ctx.mp_group, &mut sum, ReduceOp::Sum)?;
    if let Some(g) = dp_group.filter(|g| g.size() > 1) {
        ctx.comm.all_reduce_f64(g, &mut sum, ReduceOp::Sum)?;
    }
    if split_experts {
        ctx.comm.all_reduce_f64(&ctx.pp_group, &mut experts, ReduceOp::Sum)?;
        ctx.comm.all_reduce_f64(&ctx.expert_mp_group, &mut experts, ReduceOp::Sum)?;
        sum[0] += experts[0];
    }
    Ok(sum[0].sqrt())
}

/// Megatron's `clip_grad_norm`: with `max_norm > 0`, computes the global norm and, when
/// `coef = max_norm / (norm + 1e-6) < 1`, multiplies every grad by `coef`; returns the norm.
/// With `max_norm == 0` nothing is computed and the reported norm is 0.0 (as Megatron logs).
/// A non-finite norm is returned unclipped: check it with [`is_finite_norm`] and skip the step.
pub fn clip_grad_norm(
    params: &mut [&mut Param],
    max_norm: f64,
    backend: &dyn Backend,
    ctx: &ParallelContext,
) -> Result<f64> {
    clip_grad_norm_sharded(params, max_norm, backend, ctx, None)
}

/// [`clip_grad_norm`] over data-parallel gradient shards (see [`grad_norm_sharded`]).
pub fn clip_grad_norm_sharded(
    params: &mut [&mut Param],
    max_norm: f64,
    backend: &dyn Backend,
    ctx: &ParallelContext,
    dp_group: Option<&Group>,
) -> Result<f64> {
    if max_norm <= 0.0 {
        return Ok(0.0);
    }
    let norm = {
        let view: Vec<&Param> = params.iter().map(|p| &**p).collect();
        grad_norm_sharded(&view, backend, ctx, dp_group)?
    };
    if !is_finite_norm(norm) {
        return Ok(norm);
    }
    let coef = max_norm / (norm + 1e-6);
    if coef < 1.0 {
        for p in params.iter_mut() {
            backend.scale(&mut p.grad, coef as f32)?;
        }
    }
    Ok(norm)
}

/// `false` for inf or NaN: the update must be skipped (SPEC §6.7).
pub fn is_finite_norm(norm: f64) -> bool {
    norm.is_finite()
}

/// Whether any gradient of any rank of the model-parallel group holds inf or NaN (the fp16
/// loss-scaler check and `--check-for-nan-in-loss-and-grad`), all-reduced with MAX.
pub fn grads_have_inf_or_nan(params: &[&Param], backend: &dyn Backend, ctx: &ParallelContext) -> Result<bool> {
    let mut found = [0.0f64];
    for p in params {
        if backend.abs_max(&p.grad)?.1 {
            found[0] = 1.0;
            break;
        }
    }
    ctx.comm.all_reduce_f64(&ctx.mp_group, &mut found, ReduceOp::Max)?;
    if ctx.experts_sharded() {
        // Expert grads differ inside the expert grid: its ranks must agree on skipping the step.
        ctx.comm.all_reduce_f64(&ctx.expert_mp_group, &mut found, ReduceOp::Max)?;
    }
    Ok(found[0] > 0.0)
}
