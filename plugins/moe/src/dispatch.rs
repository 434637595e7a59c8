//! Token movement for expert parallelism (SPEC §4.12 "Dispatchers", §5.8). The expert-parallel
//! group is cut from the data-parallel group (Megatron's parallel folding with tp = cp = 1):
//! `ep` consecutive DP ranks share the experts, rank `r` of it holding experts
//! `[r·E/ep, (r+1)·E/ep)`. Rows are host f32 vectors of a fixed width.
//!
//! * `alltoall`: tokens are permuted by expert, sent to the expert's rank with
//!   [`Communicator::all_to_all`] (variable splits), regrouped by local expert, computed, and
//!   sent back the same way.
//! * `allgather`: every rank all-gathers all tokens and routes, computes its experts' share and
//!   a reduce-scatter sums the shares back to the token owners.

use anyhow::{bail, Result};
use megatron_core::{Backend, Communicator, DType, DeviceTensor, Group, HostBuffer, ParallelContext, ReduceOp};
use std::sync::Arc;

/// This rank's expert-parallel group.
#[derive(Clone)]
pub struct EpGroup {
    pub group: Group,
    /// Position in the group.
    pub rank: usize,
    pub size: usize,
    comm: Arc<dyn Communicator>,
    backend: Arc<dyn Backend>,
}

impl EpGroup {
    /// The EP group of `ctx` (its expert grid, `ParallelContext::with_expert_parallel`), or,
    /// for a context built without one (layer-level tests), the same grid derived here.
    pub fn new(ctx: &ParallelContext, backend: Arc<dyn Backend>, ep: usize) -> Result<EpGroup> {
        if ep > 1 && (ctx.tp_size() > 1 || ctx.grid.cp > 1) {
            bail!(
                "--expert-model-parallel-size {ep} with tensor or context parallelism is not implemented in the moe \
                 plugin (expert-TP and the TP×EP dispatch); use tp = cp = 1 with ep > 1"
            );
        }
        let ctx = if ctx.expert_model_parallel_size == ep {
            ctx.clone()
        } else if ctx.expert_model_parallel_size == 1 {
            ctx.clone().with_expert_parallel(ep)?
        } else {
            bail!(
                "the moe plugin was configured for --expert-model-parallel-size {ep} but the parallel context has {}",
                ctx.expert_model_parallel_size
            );
        };
        Ok(EpGroup { group: ctx.ep_group.clone(), rank: ctx.ep_rank, size: ep, comm: ctx.comm.clone(), backend })
    }

    fn tensor(&self, v: Vec<f32>, rows: usize, width: usize) -> Result<DeviceTensor> {
        self.backend.from_host(HostBuffer::F32(v), &[rows, width])
    }

    /// Variable-split all-to-all of rows of `width` floats.
    pub fn all_to_all(&self, rows: Vec<f32>, width: usize, send: &[usize], recv: &[usize]) -> Result<Vec<f32>> {
        let input = self.tensor(rows, send.iter().sum(), width)?;
        let mut out = self.backend.zeros(&[recv.iter().sum(), width], DType::F32)?;
        self.comm.all_to_all(&self.group, &input, send, &mut out, recv)?;
        Ok(out.host_f32()?.to_vec())
    }

    /// Rows of every member, in group order.
    pub fn all_gather(&self, rows: Vec<f32>, width: usize) -> Result<Vec<f32>> {
        let n = rows.len() / width.max(1);
        let input = self.tensor(rows, n, width)?;
        let mut out = self.backend.zeros(&[n * self.size, width], DType::F32)?;
        self.comm.all_gather(&self.group, &input, &mut out)?;
        Ok(out.host_f32()?.to_vec())
    }

    /// This member's share of the sum of everybody's `rows` (equal shares along dim 0).
    pub fn reduce_scatter(&self, rows: Vec<f32>, width: usize) -> Result<Vec<f32>> {
        let n = rows.len() / width.max(1);
        let input = self.tensor(rows, n, width)?;
        let mut out = self.backend.zeros(&[n / self.size, width], DType::F32)?;
        self.comm.reduce_scatter(&self.group, &input, &mut out, ReduceOp::Sum)?;
        Ok(out.host_f32()?.to_vec())
    }
}

/// Received rows come ordered `(source s, local expert j)`; the experts want `(j, s)`.
/// Returns `order` (new row `i` is received row `order[i]`) and the rows per local expert.
pub fn regroup(counts_from: &[usize], ep: usize, local: usize) -> (Vec<usize>, Vec<usize>) {
    let mut start = vec![0usize; ep * local];
    let mut acc = 0;
    for (i, &c) in counts_from.iter().enumerate() {
        start[i] = acc;
        acc += c;
    }
    let mut order = Vec::with_capacity(acc);
    let mut sizes = vec![0usize; local];
    for j in 0..local {
        for s in 0..ep {
            let c = counts_from[s * local + j];
            order.extend(start[s * local + j]..start[s * local + j] + c);
            sizes[j] += c;
        }
    }
    (order, sizes)
}

/// `rows[order[i]]` for every i.
pub fn gather_rows(rows: &[f32], width: usize, order: &[usize]) -> Vec<f32> {
    order.iter().flat_map(|&r| rows[r * width..(r + 1) * width].iter().copied()).collect()
}

/// The inverse of [`gather_rows`]: row `i` of `rows` goes to position `order[i]`.
pub fn scatter_rows(rows: &[f32], width: usize, order: &[usize]) -> Vec<f32> {
    let mut out = vec![0.0f32; rows.len()];
    for (i, &r) in order.iter().enumerate() {
        out[r * width..(r + 1) * width].copy_from_slice(&rows[i * width..(i + 1) * width]);
    }
    out
}
