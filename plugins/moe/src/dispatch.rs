//! Token movement for expert parallelism (SPEC §4.12 "Dispatchers", §5.8). The expert grid
//! (`etp × ep × edp`) is cut from the TP×DP ranks of a pipeline stage (Megatron's parallel
//! folding, `ParallelContext::with_expert_grid`): EP rank `r` holds experts
//! `[r·E/ep, (r+1)·E/ep)`, each split over its expert-TP group. When the grid spans TP ranks,
//! each TP rank dispatches its own share of the (TP-replicated) tokens. Rows are host f32
//! vectors of a fixed width.
//!
//! * `alltoall`: tokens are permuted by expert, sent to the expert's rank with
//!   [`Communicator::all_to_all`] (variable splits), regrouped by local expert, computed, and
//!   sent back the same way.
//! * `allgather`: every rank all-gathers all tokens and routes, computes its experts' share and
//!   a reduce-scatter sums the shares back to the token owners.
//! * expert TP (etp > 1, both dispatchers): the rows an expert-TP member received are
//!   all-gathered over the expert-TP group (variable counts), every member computes its
//!   column/row slice of the experts (partial outputs), and a reduce-scatter sums the partial
//!   outputs back to the member that received the rows ([`EpGroup::all_gather_v`],
//!   [`EpGroup::reduce_scatter_v`]); backward does the same with `dZ` and `[dx | dgate]`.

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
    /// The EP group of `ctx` (its expert grid, `ParallelContext::with_expert_grid`), or, for a
    /// context built without one (layer-level tests), the same grid derived here.
    pub fn new(ctx: &ParallelContext, backend: Arc<dyn Backend>, ep: usize) -> Result<EpGroup> {
        let ctx = expert_grid(ctx, ep, 1)?;
        Ok(EpGroup::of(&ctx, ctx.ep_group.clone(), backend))
    }

    /// The member of `group` that `ctx`'s rank is.
    pub fn of(ctx: &ParallelContext, group: Group, backend: Arc<dyn Backend>) -> EpGroup {
        let rank = group.ranks.iter().position(|&r| r == ctx.rank).unwrap_or(0);
        EpGroup { size: group.size(), group, rank, comm: ctx.comm.clone(), backend }
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

    /// Every member's rows, in group order, when member `r` has `counts[r]` rows (an
    /// all-to-all sending this member's rows to everyone).
    pub fn all_gather_v(&self, rows: Vec<f32>, width: usize, counts: &[usize]) -> Result<Vec<f32>> {
        let send = vec![counts[self.rank]; self.size];
        let input: Vec<f32> = (0..self.size).flat_map(|_| rows.iter().copied()).collect();
        self.all_to_all(input, width, &send, counts)
    }

    /// The inverse of [`EpGroup::all_gather_v`] for partial sums: `rows` holds a partial
    /// value of every member's rows (block `r` of `counts[r]` rows); returns the sum over the
    /// members of this member's block, added in member order (deterministic).
    pub fn reduce_scatter_v(&self, rows: Vec<f32>, width: usize, counts: &[usize]) -> Result<Vec<f32>> {
        let mine = counts[self.rank] * width;
        let got = self.all_to_all(rows, width, counts, &vec![counts[self.rank]; self.size])?;
        let mut out = vec![0.0f32; mine];
        for part in got.chunks(mine.max(1)).take(self.size) {
            out.iter_mut().zip(part).for_each(|(o, v)| *o += v);
        }
        Ok(out)
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

/// `ctx` with the expert grid `ep × etp` (SPEC §5.1 parallel folding): `ctx` itself when the
/// strategy built it so, else derived from its dense grid (layer-level tests build plain
/// contexts). The grid folds over the context-parallel ranks too: tokens are rows, so a CP
/// rank's sequence shard is dispatched like a DP rank's samples.
pub fn expert_grid(ctx: &ParallelContext, ep: usize, etp: usize) -> Result<ParallelContext> {
    let (have_ep, have_etp) = (ctx.expert_model_parallel_size, ctx.expert_tensor_parallel_size);
    if (have_ep, have_etp) == (ep, etp) {
        Ok(ctx.clone())
    } else if (have_ep, have_etp) == (1, 1) {
        ctx.clone().with_expert_grid(ep, etp)
    } else {
        bail!(
            "the moe plugin was configured for --expert-model-parallel-size {ep} --expert-tensor-parallel-size {etp} \
             but the parallel context has {have_ep} and {have_etp}"
        )
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
