//! The `megatron` parallel strategy: builds the rank grid of SPEC §5.1 from the TP/PP/CP sizes
//! and averages gradients over data parallelism as Megatron's DDP does by default (§5.6):
//! pre-scale by `1/(dp*cp)`, then SUM all-reduce over the DP×CP group.

use crate::ddp::{DdpOptions, DdpReducer};
use anyhow::{bail, Context, Result};
use megatron_core::{
    Backend, Communicator, GradSync, Group, ParallelContext, ParallelStrategy, Param, RankGrid, ReduceOp,
};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Config of the `megatron` strategy; the data-parallel size is derived from the world size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StrategyConfig {
    /// `--tensor-model-parallel-size`.
    #[serde(default = "one")]
    pub tensor_model_parallel_size: usize,
    /// `--pipeline-model-parallel-size`.
    #[serde(default = "one")]
    pub pipeline_model_parallel_size: usize,
    /// `--context-parallel-size`.
    #[serde(default = "one")]
    pub context_parallel_size: usize,
    /// `--ddp-bucket-size` in elements (default: Megatron's `max(40M, 1M*dp*cp)` with
    /// overlap, one bucket without).
    #[serde(default)]
    pub ddp_bucket_size: Option<usize>,
    /// `--overlap-grad-reduce`: all-reduce each bucket on a communication thread as soon as
    /// its gradients are final in the last microbatch's backward.
    #[serde(default)]
    pub overlap_grad_reduce: bool,
    /// `--expert-model-parallel-size`: the expert grid folded over DP×CP (SPEC §5.1, §5.8).
    #[serde(default = "one")]
    pub expert_model_parallel_size: usize,
    /// `--expert-tensor-parallel-size`: each expert split over this many ranks of the expert
    /// grid (SPEC §5.1). Default 1 (Megatron's default is the dense TP size).
    #[serde(default = "one")]
    pub expert_tensor_parallel_size: usize,
}

fn one() -> usize {
    1
}

impl Default for StrategyConfig {
    fn default() -> StrategyConfig {
        StrategyConfig {
            tensor_model_parallel_size: 1,
            pipeline_model_parallel_size: 1,
            context_parallel_size: 1,
            ddp_bucket_size: None,
            overlap_grad_reduce: false,
            expert_model_parallel_size: 1,
            expert_tensor_parallel_size: 1,
        }
    }
}

#[derive(Debug)]
pub struct MegatronStrategy {
    config: StrategyConfig,
}

impl MegatronStrategy {
    pub fn new(config: StrategyConfig) -> Result<MegatronStrategy> {
        if config.ddp_bucket_size == Some(0) {
            bail!("--ddp-bucket-size must be > 0 (elements per gradient bucket)");
        }
        for (v, flag) in [
            (config.tensor_model_parallel_size, "--tensor-model-parallel-size"),
            (config.pipeline_model_parallel_size, "--pipeline-model-parallel-size"),
            (config.context_parallel_size, "--context-parallel-size"),
            (config.expert_model_parallel_size, "--expert-model-parallel-size"),
            (config.expert_tensor_parallel_size, "--expert-tensor-parallel-size"),
        ] {
            if v == 0 {
                bail!("{flag} must be >= 1");
            }
        }
        Ok(MegatronStrategy { config })
    }

    pub fn config(&self) -> &StrategyConfig {
        &self.config
    }
}

/// The DP×CP group of this rank (ranks sharing its TP and PP coordinates): gradients of
/// replicas over data *and* context parallelism are averaged together (SPEC §5.6). With
/// `cp == 1` it is exactly `ctx.dp_group`.
pub fn dp_cp_group(ctx: &ParallelContext) -> Group {
    if ctx.grid.cp == 1 {
        return ctx.dp_group.clone();
    }
    let me = ctx.grid.coords(ctx.rank);
    let ranks = (0..ctx.world_size())
        .filter(|&r| {
            let c = ctx.grid.coords(r);
            c.tp == me.tp && c.pp == me.pp
        })
        .collect();
    Group::new("dp-cp", ranks)
}

impl ParallelStrategy for MegatronStrategy {
    fn name(&self) -> &str {
        "megatron"
    }

    fn build_context(&self, comm: Arc<dyn Communicator>) -> Result<ParallelContext> {
        let c = &self.config;
        let grid = RankGrid::new(
            comm.world_size(),
            c.tensor_model_parallel_size,
            c.context_parallel_size,
            c.pipeline_model_parallel_size,
        )?;
        let rank = comm.rank();
        if rank >= grid.world_size() {
            bail!("communicator `{}` reports rank {rank} in a world of {} ranks", comm.name(), grid.world_size());
        }
        grid.context(rank, comm).with_expert_grid(c.expert_model_parallel_size, c.expert_tensor_parallel_size)
    }

    /// Megatron's DDP buckets (and, with `overlap_grad_reduce`, the overlapped reduction);
    /// `None` when there is no data parallelism to reduce over.
    fn grad_sync(
        &self,
        params: &[&Param],
        backend: Arc<dyn Backend>,
        ctx: &ParallelContext,
    ) -> Result<Option<Box<dyn GradSync>>> {
        // Experts sharded over TP ranks (ep·etp > 1 with tp > 1) have replicas outside the
        // DP×CP group: they still need the expert-data-parallel reduction.
        if dp_cp_group(ctx).size() == 1 && ctx.edp_group.size() == 1 {
            return Ok(None);
        }
        let options = DdpOptions {
            bucket_size: self.config.ddp_bucket_size,
            overlap_grad_reduce: self.config.overlap_grad_reduce,
            shard_for_distributed_optimizer: false,
        };
        Ok(Some(Box::new(DdpReducer::new(params, options, backend, ctx)?)))
    }

    fn reduce_gradients(&self, params: &mut [&mut Param], backend: &dyn Backend, ctx: &ParallelContext) -> Result<()> {
        let group = dp_cp_group(ctx);
        if group.size() == 1 && ctx.edp_group.size() == 1 {
            return Ok(());
        }
        // Pre-scaling (rather than dividing the sum) is Megatron's default and keeps the
        // partial sums in range for low-precision gradient buffers. Expert parameters get the
        // same `1/(dp·cp)` but are summed over the expert-data-parallel group (SPEC §5.6, §5.8).
        let scale = 1.0 / group.size() as f32;
        for p in params.iter_mut() {
            backend.scale(&mut p.grad, scale).with_context(|| format!("pre-scaling the gradient of {}", p.name))?;
            let expert = p.layout.expert_parallel && ctx.experts_sharded();
            let g = if expert { &ctx.edp_group } else { &group };
            if g.size() > 1 {
                ctx.comm.all_reduce(g, &mut p.grad, ReduceOp::Sum)?;
            }
        }
        Ok(())
    }
}
