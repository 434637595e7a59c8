//! The `interleaved-1f1b` schedule: runs the order of [`crate::interleaved_order`] on a rank
//! holding `vp` model chunks ([`megatron_core::ModelChunks`], SPEC §5.5). Chunk `c` of
//! pipeline rank `r` is virtual stage `c·pp + r`: its input comes from rank `r − 1` chunk `c`
//! (rank `pp − 1` chunk `c − 1` when `r = 0`) and its output goes to rank `r + 1` chunk `c`
//! (rank 0 chunk `c + 1` when `r = pp − 1`); gradients go the other way.
//!
//! Point-to-point channels. As in `1f1b`, a rank receives right before it needs a tensor and
//! sends right after producing it (buffered sends). Activations travel on the pipeline group
//! and gradients on a second group of the same ranks (`pp-grad`), so the two kinds never
//! share a (sender, receiver) queue: with pp = 2 both neighbours are the same rank, which is
//! why Megatron needs pp > 2 unless it batches its p2p calls. On each channel a sender's
//! messages go out in its table order and the receiver takes them in its own table order;
//! both orders list the virtual stages' microbatches in the same sequence (the chunk shift at
//! the wrap-around keeps the (group, chunk, microbatch) order), so messages never cross.
//!
//! Gradient sync (Megatron's `no_sync`): each chunk's LAST backward of the step runs with the
//! data-parallel hook, so its buckets may start while the other chunks still run backward.

use crate::interleaved::{interleaved_order, ChunkAction};
use anyhow::{bail, Context, Result};
use megatron_core::registry::{parse_config, ConfigDe};
use megatron_core::{
    Batch, DeviceTensor, Factory, GradsReadyHook, Group, LossReport, Mode, Model, ParallelContext, Param, Plugin,
    Schedule, StageOutput,
};
use serde::Deserialize;
use std::collections::BTreeMap;

/// Config of the `interleaved-1f1b` schedule.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterleavedConfig {
    /// Megatron's `--microbatch-group-size-per-virtual-pipeline-stage` (default: pp).
    #[serde(default)]
    pub microbatch_group_size: Option<usize>,
}

/// The interleaved 1F1B schedule.
#[derive(Clone, Copy, Debug, Default)]
pub struct InterleavedOneFOneB {
    config: InterleavedConfig,
}

impl InterleavedOneFOneB {
    pub fn new(config: InterleavedConfig) -> InterleavedOneFOneB {
        InterleavedOneFOneB { config }
    }
}

fn factory(de: ConfigDe) -> Result<Box<dyn Schedule>> {
    Ok(Box::new(InterleavedOneFOneB::new(parse_config(de, "interleaved-1f1b")?)))
}

/// The registry entry of the `interleaved-1f1b` schedule.
pub fn plugin() -> Plugin {
    Plugin {
        name: "interleaved-1f1b",
        description: "interleaved 1F1B pipeline schedule over the model chunks (virtual stages) of each rank; \
                      needs pp >= 2 and a model split into chunks; config: microbatch_group_size (default pp)",
        factory: Factory::Schedule(factory),
    }
}

/// Where the input of a chunk comes from / its output goes to: `(global rank, chunk)`.
struct Ring {
    ranks: Vec<usize>,
    me: usize,
    vp: usize,
}

impl Ring {
    /// The previous virtual stage of chunk `c` (`None` for the first virtual stage).
    fn prev(&self, c: usize) -> Option<usize> {
        match (self.me, c) {
            (0, 0) => None,
            (0, _) => self.ranks.last().copied(),
            (r, _) => Some(self.ranks[r - 1]),
        }
    }
    /// The next virtual stage of chunk `c` (`None` for the last virtual stage).
    fn next(&self, c: usize) -> Option<usize> {
        let pp = self.ranks.len();
        if self.me + 1 == pp {
            (c + 1 < self.vp).then_some(self.ranks[0])
        } else {
            Some(self.ranks[self.me + 1])
        }
    }
}

impl Schedule for InterleavedOneFOneB {
    fn name(&self) -> &str {
        "interleaved-1f1b"
    }

    fn run_with_grad_hook(
        &mut self,
        model: &mut dyn Model,
        next_batch: &mut dyn FnMut() -> Result<Batch>,
        num_microbatches: usize,
        forward_only: bool,
        ctx: &ParallelContext,
        on_grads_ready: GradsReadyHook,
    ) -> Result<Vec<LossReport>> {
        let (pp, vp, m) = (ctx.pp_size(), model.num_model_chunks(), num_microbatches);
        let me = ctx
            .pp_group
            .index_of(ctx.rank)
            .with_context(|| format!("rank {} is not in its pipeline group {:?}", ctx.rank, ctx.pp_group.ranks))?;
        if vp < 2 {
            bail!(
                "the interleaved schedule needs a model split into >= 2 chunks per pipeline rank (model `{}` has \
                 {vp}); build it with --num-layers-per-virtual-pipeline-stage / --num-virtual-stages-per-pipeline-rank",
                model.name()
            );
        }
        let group = self.config.microbatch_group_size.unwrap_or(pp);
        let order = interleaved_order(pp, me, vp, m, group, forward_only)?;
        let ring = Ring { ranks: ctx.pp_group.ranks.clone(), me, vp };
        let grad_group = Group::new("pp-grad", ctx.pp_group.ranks.clone());
        let mode = if forward_only { Mode::Eval } else { Mode::Train };
        // The position of each chunk's last backward (it runs with the gradient hook).
        let mut last_backward = vec![usize::MAX; vp];
        for (i, a) in order.iter().enumerate() {
            if let ChunkAction::Backward { chunk, .. } = *a {
                last_backward[chunk] = i;
            }
        }
        // Every chunk pulls the same microbatches; the batch of microbatch `mb` is pulled once
        // (by its first forward) and kept until its last backward (or last forward).
        let mut batches: BTreeMap<usize, Batch> = BTreeMap::new();
        let mut uses: BTreeMap<usize, usize> = BTreeMap::new();
        let per_mb_uses = if forward_only { vp } else { 2 * vp };
        let mut scales: BTreeMap<usize, f32> = BTreeMap::new();
        let mut reports = Vec::new();
        let mut no_hook = |_: &[&Param]| Ok(());
        for (step, action) in order.iter().enumerate() {
            match *action {
                ChunkAction::Forward { microbatch: mb, chunk } => {
                    if let std::collections::btree_map::Entry::Vacant(e) = batches.entry(mb) {
                        e.insert(next_batch()?);
                    }
                    let batch = &batches[&mb];
                    let input = match ring.prev(chunk) {
                        Some(src) => Some(receive(model, ctx, &ctx.pp_group, batch, src, "activation", mb, chunk)?),
                        None => None,
                    };
                    match model.forward_chunk(chunk, mb, batch, input, mode)? {
                        StageOutput::Hidden(h) => {
                            let dst = ring.next(chunk).context("the last virtual stage produced hidden states")?;
                            send(ctx, &ctx.pp_group, &h, dst, "activation", mb, chunk)?;
                        }
                        StageOutput::Loss(report) => {
                            reports.push(report);
                            // Per-token mean, averaged over the microbatches (SPEC §6.8).
                            scales.insert(mb, (1.0 / report.num_tokens.max(1.0) / m as f64) as f32);
                        }
                    }
                    release(&mut batches, &mut uses, mb, per_mb_uses);
                }
                ChunkAction::Backward { microbatch: mb, chunk } => {
                    let batch = batches.get(&mb).context("interleaved order ran a backward before its forward")?;
                    let (grad, scale) = match ring.next(chunk) {
                        Some(src) => (Some(receive(model, ctx, &grad_group, batch, src, "gradient", mb, chunk)?), 1.0),
                        None => (None, scales.remove(&mb).context("no loss scale for the last virtual stage")?),
                    };
                    let hook: GradsReadyHook =
                        if last_backward[chunk] == step { &mut *on_grads_ready } else { &mut no_hook };
                    let d_input = model.backward_chunk(chunk, mb, grad, scale, hook)?;
                    if let Some(dst) = ring.prev(chunk) {
                        let d_input = d_input.context("a non-first virtual stage returned no input gradient")?;
                        send(ctx, &grad_group, &d_input, dst, "gradient", mb, chunk)?;
                    }
                    release(&mut batches, &mut uses, mb, per_mb_uses);
                }
            }
        }
        Ok(reports)
    }
}

/// Counts one use of microbatch `mb`'s batch and drops it after its last one.
fn release(batches: &mut BTreeMap<usize, Batch>, uses: &mut BTreeMap<usize, usize>, mb: usize, total: usize) {
    let n = uses.entry(mb).or_insert(0);
    *n += 1;
    if *n == total {
        batches.remove(&mb);
        uses.remove(&mb);
    }
}

#[allow(clippy::too_many_arguments)]
fn receive(
    model: &dyn Model,
    ctx: &ParallelContext,
    group: &Group,
    batch: &Batch,
    src: usize,
    what: &str,
    mb: usize,
    chunk: usize,
) -> Result<DeviceTensor> {
    let mut t = model.stage_buffer(batch)?;
    ctx.comm.recv(group, &mut t, src).with_context(|| {
        format!(
            "interleaved 1F1B: receiving the {what} of microbatch {mb} (chunk {chunk}) from rank {src} on rank {}",
            ctx.rank
        )
    })?;
    Ok(t)
}

fn send(
    ctx: &ParallelContext,
    group: &Group,
    t: &DeviceTensor,
    dst: usize,
    what: &str,
    mb: usize,
    chunk: usize,
) -> Result<()> {
    ctx.comm.send(group, t, dst).with_context(|| {
        format!(
            "interleaved 1F1B: sending the {what} of microbatch {mb} (chunk {chunk}) to rank {dst} from rank {}",
            ctx.rank
        )
    })
}
