//! The `1f1b` schedule: Megatron's non-interleaved one-forward-one-backward pipeline
//! (SPEC §5.5). Stage `r` of `pp` runs `warmup = min(pp - r - 1, M)` forwards, then
//! `M - warmup` times one forward and one backward, then `warmup` backwards; the last stage
//! has no warmup. Forward-only (evaluation) runs every microbatch's forward in turn.
//!
//! Activations go to the next stage and gradients back to the previous one with
//! point-to-point `send`/`recv` on `ctx.pp_group` (global ranks). A stage receives right
//! before it needs a tensor and sends right after producing it. This is deadlock-free when
//! `send` does not wait for the matching `recv` (buffered/eager sends, as the `local`
//! communicator's mailboxes): every `recv` then waits only for work its peer does earlier in
//! the 1F1B dependency order. A rendezvous communicator would need paired send/recv instead.
//!
//! Loss scaling (SPEC §6.8): the last stage starts backward from `loss_sum /
//! max(num_tokens, 1) / M` of the microbatch; earlier stages only pass gradients on.

use anyhow::{bail, Context, Result};
use megatron_core::registry::{parse_config, ConfigDe};
use megatron_core::{
    Batch, DeviceTensor, Factory, GradsReadyHook, LossReport, Mode, Model, ParallelContext, Plugin, Schedule,
    StageOutput,
};
use serde::Deserialize;
use std::collections::BTreeMap;

/// One step of a stage's schedule, by microbatch index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PipelineAction {
    /// Receive the input (unless first stage), forward, send the output (unless last).
    Forward(usize),
    /// Receive the output gradient (unless last stage), backward, send the input gradient
    /// (unless first).
    Backward(usize),
}

/// The 1F1B order of stage `stage` of `pp` for `num_microbatches` microbatches.
pub fn one_f_one_b_order(pp: usize, stage: usize, num_microbatches: usize, forward_only: bool) -> Vec<PipelineAction> {
    use PipelineAction::{Backward, Forward};
    let m = num_microbatches;
    if forward_only {
        return (0..m).map(Forward).collect();
    }
    let warmup = (pp - stage - 1).min(m);
    let mut order: Vec<PipelineAction> = (0..warmup).map(Forward).collect();
    for i in 0..m - warmup {
        order.push(Forward(warmup + i));
        order.push(Backward(i));
    }
    order.extend((m - warmup..m).map(Backward));
    order
}

/// The `1f1b` schedule (no options).
#[derive(Clone, Copy, Debug, Default)]
pub struct OneFOneB;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct OneFOneBConfig {}

fn factory(de: ConfigDe) -> Result<Box<dyn Schedule>> {
    let OneFOneBConfig {} = parse_config(de, "1f1b")?;
    Ok(Box::new(OneFOneB))
}

/// The registry entry of the `1f1b` schedule.
pub fn plugin() -> Plugin {
    Plugin {
        name: "1f1b",
        description: "non-interleaved 1F1B pipeline schedule (warmup forwards, one forward one backward, cooldown \
                      backwards; p2p send/recv over the pipeline group); any pp >= 1",
        factory: Factory::Schedule(factory),
    }
}

/// Neighbouring global ranks of this stage in its pipeline.
struct Peers {
    prev: Option<usize>,
    next: Option<usize>,
}

impl Peers {
    fn new(ctx: &ParallelContext, model: &dyn Model) -> Result<Peers> {
        let ranks = &ctx.pp_group.ranks;
        let me = ctx
            .pp_group
            .index_of(ctx.rank)
            .with_context(|| format!("rank {} is not in its pipeline group {:?}", ctx.rank, ctx.pp_group.ranks))?;
        if model.is_first_stage() != (me == 0) || model.is_last_stage() != (me + 1 == ranks.len()) {
            bail!(
                "model `{}` was built as a different pipeline stage than rank {} (stage {me} of {}); build the \
                 model with the same ParallelContext the schedule runs with",
                model.name(),
                ctx.rank,
                ranks.len()
            );
        }
        Ok(Peers { prev: me.checked_sub(1).map(|i| ranks[i]), next: ranks.get(me + 1).copied() })
    }
}

impl Schedule for OneFOneB {
    fn name(&self) -> &str {
        "1f1b"
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
        if num_microbatches == 0 {
            bail!("a global batch needs at least one microbatch (--global-batch-size / (--micro-batch-size x dp))");
        }
        let peers = Peers::new(ctx, model)?;
        let (pp, stage) = (ctx.pp_group.size(), ctx.pp_group.index_of(ctx.rank).unwrap_or(0));
        let mode = if forward_only { Mode::Eval } else { Mode::Train };
        let order = one_f_one_b_order(pp, stage, num_microbatches, forward_only);
        let mut reports = Vec::new();
        // Per in-flight microbatch: its batch (shapes of the gradient to receive) and, on the
        // last stage, the d loss / d per-token loss scale.
        let mut in_flight: BTreeMap<usize, (Batch, f32)> = BTreeMap::new();
        let mut no_hook = |_: &[&megatron_core::Param]| Ok(());
        for (step, action) in order.iter().enumerate() {
            match *action {
                PipelineAction::Forward(mb) => {
                    let batch = next_batch()?;
                    let input = match peers.prev {
                        Some(src) => Some(receive(model, ctx, &batch, src, "activation", mb)?),
                        None => None,
                    };
                    let scale = match model.forward_stage(mb, &batch, input, mode)? {
                        StageOutput::Hidden(h) => {
                            let dst =
                                peers.next.context("the last pipeline stage produced hidden states, not a loss")?;
                            send(ctx, &h, dst, "activation", mb)?;
                            1.0
                        }
                        StageOutput::Loss(report) => {
                            reports.push(report);
                            // Per-token mean, averaged over the microbatches (SPEC §6.8).
                            (1.0 / report.num_tokens.max(1.0) / num_microbatches as f64) as f32
                        }
                    };
                    if !forward_only {
                        in_flight.insert(mb, (batch, scale));
                    }
                }
                PipelineAction::Backward(mb) => {
                    let (batch, scale) =
                        in_flight.remove(&mb).context("1F1B order ran a backward before its forward")?;
                    let grad = match peers.next {
                        Some(src) => Some(receive(model, ctx, &batch, src, "gradient", mb)?),
                        None => None,
                    };
                    // Only the step's last backward runs with gradient sync on (Megatron's no_sync).
                    let hook: GradsReadyHook =
                        if step + 1 == order.len() { &mut *on_grads_ready } else { &mut no_hook };
                    let d_input = model.backward_stage(mb, grad, scale, hook)?;
                    if let Some(dst) = peers.prev {
                        let d_input = d_input.context("a non-first pipeline stage returned no input gradient")?;
                        send(ctx, &d_input, dst, "gradient", mb)?;
                    }
                }
            }
        }
        Ok(reports)
    }
}

fn receive(
    model: &dyn Model,
    ctx: &ParallelContext,
    batch: &Batch,
    src: usize,
    what: &str,
    mb: usize,
) -> Result<DeviceTensor> {
    let mut t = model.stage_buffer(batch)?;
    ctx.comm.recv(&ctx.pp_group, &mut t, src).with_context(|| {
        format!("1F1B: receiving the {what} of microbatch {mb} from rank {src} on rank {}", ctx.rank)
    })?;
    Ok(t)
}

fn send(ctx: &ParallelContext, t: &DeviceTensor, dst: usize, what: &str, mb: usize) -> Result<()> {
    ctx.comm
        .send(&ctx.pp_group, t, dst)
        .with_context(|| format!("1F1B: sending the {what} of microbatch {mb} to rank {dst} from rank {}", ctx.rank))
}

#[cfg(test)]
mod tests {
    use super::*;
    use PipelineAction::{Backward as B, Forward as F};

    fn render(order: &[PipelineAction]) -> String {
        let parts: Vec<String> = order
            .iter()
            .map(|a| match a {
                F(i) => format!("F{i}"),
                B(i) => format!("B{i}"),
            })
            .collect();
        parts.join(" ")
    }

    #[test]
    fn pp4_m8_matches_spec_example() {
        // SPEC §5.5: rank0 F F F (warmup 3) then 5x(F,B) then B B B; rank3 8x(F,B).
        let want = [
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
            "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
            "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7",
        ];
        for (rank, want) in want.iter().enumerate() {
            assert_eq!(render(&one_f_one_b_order(4, rank, 8, false)), *want, "rank {rank}");
        }
    }

    #[test]
    fn in_flight_is_bounded_and_every_microbatch_runs_once() {
        for pp in 1..=5 {
            for m in 1..=9 {
                for rank in 0..pp {
                    let order = one_f_one_b_order(pp, rank, m, false);
                    let (mut live, mut peak) = (0usize, 0usize);
                    let (mut fwd, mut bwd) = (Vec::new(), Vec::new());
                    for a in &order {
                        match *a {
                            F(i) => {
                                fwd.push(i);
                                live += 1;
                            }
                            B(i) => {
                                assert!(fwd.contains(&i), "backward {i} before its forward");
                                bwd.push(i);
                                live -= 1;
                            }
                        }
                        peak = peak.max(live);
                    }
                    assert_eq!(fwd, (0..m).collect::<Vec<_>>());
                    assert_eq!(bwd, (0..m).collect::<Vec<_>>());
                    assert_eq!(peak, (pp - rank).min(m), "pp {pp} rank {rank} M {m}");
                }
            }
        }
        assert_eq!(render(&one_f_one_b_order(4, 0, 2, false)), "F0 F1 B0 B1");
        assert_eq!(render(&one_f_one_b_order(4, 1, 3, true)), "F0 F1 F2");
    }
}
