//! Continuous batching over a tensor- and pipeline-parallel model: every rank holds one shard
//! of the model and its own slotted kv cache, and every model call is a collective that all
//! ranks must make together with the same arguments.
//!
//! Global rank 0 (first pipeline stage, TP rank 0) runs the [`crate::Engine`] — queue,
//! scheduling, sampling — and is the *driver*: before each model call it broadcasts a
//! [`Plan`] to the world; every other rank runs [`follow`], which receives the plans and makes
//! the same calls on its shard. The logits reach the driver through
//! [`megatron_gpt::GptModel::forward_slots`] (gathered over TP, sent back from the last stage);
//! sampling stays on the driver, so outputs depend on nothing but the logits.
//!
//! Slots are mirrored, not sent: a plan carries each row's cached length, a row at length 0
//! is a fresh prefill (the follower frees that slot first, as the driver did), and any other
//! length must equal the follower's own (else the ranks are out of step: an error).
//!
//! While idle the driver broadcasts a heartbeat every [`HEARTBEAT`] so that the followers'
//! waits never reach the communicator's timeout; a follower that fails aborts the world, so
//! the driver's next call fails at once instead of hanging.

use anyhow::{bail, Context, Result};
use megatron_core::{DType, HostBuffer, ParallelContext};
use megatron_gpt::{GptModel, SlotCall, SlotKvCache};
use std::time::{Duration, Instant};

/// Longest the driver stays silent while idle.
pub const HEARTBEAT: Duration = Duration::from_millis(500);

/// What the driver tells the followers to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Make a slotted cache of `slots` slots of `capacity` tokens (sent once, first).
    Init { slots: usize, capacity: usize },
    /// `forward_slots_with(tokens, slots, valid, pick)`, row `r` having `offsets[r]` tokens cached.
    Forward { slots: Vec<usize>, offsets: Vec<usize>, tokens: Vec<i32>, valid: Vec<usize>, pick: Vec<usize> },
    /// Nothing to do (keeps the followers' waits short of the timeout).
    Idle,
    /// The server is shutting down.
    Stop,
}

impl Plan {
    /// `[kind, a, b, c]` and the payload: `slots ++ offsets ++ valid ++ tokens ++ pick` for a
    /// forward (`[1, B, Tq, picked]`).
    fn encode(&self) -> ([i32; 4], Vec<i32>) {
        match self {
            Plan::Init { slots, capacity } => ([0, *slots as i32, *capacity as i32, 0], Vec::new()),
            Plan::Forward { slots, offsets, tokens, valid, pick } => {
                let ids = |v: &[usize]| v.iter().map(|&x| x as i32).collect::<Vec<_>>();
                let payload = [ids(slots), ids(offsets), ids(valid), tokens.clone(), ids(pick)].concat();
                ([1, slots.len() as i32, (tokens.len() / slots.len().max(1)) as i32, pick.len() as i32], payload)
            }
            Plan::Idle => ([2, 0, 0, 0], Vec::new()),
            Plan::Stop => ([3, 0, 0, 0], Vec::new()),
        }
    }

    fn payload_len(header: [i32; 4]) -> usize {
        match header {
            [1, b, tq, picked] => (b.max(0) as usize) * (3 + tq.max(0) as usize) + picked.max(0) as usize,
            _ => 0,
        }
    }

    fn decode(header: [i32; 4], payload: &[i32]) -> Result<Plan> {
        Ok(match header {
            [0, slots, capacity, _] => Plan::Init { slots: slots as usize, capacity: capacity as usize },
            [1, b, tq, _] => {
                let (b, tq) = (b as usize, tq as usize);
                let ids = |v: &[i32]| v.iter().map(|&x| x as usize).collect::<Vec<_>>();
                let (head, rest) = payload.split_at(3 * b);
                let (tokens, pick) = rest.split_at(b * tq);
                Plan::Forward {
                    slots: ids(&head[..b]),
                    offsets: ids(&head[b..2 * b]),
                    valid: ids(&head[2 * b..]),
                    tokens: tokens.to_vec(),
                    pick: ids(pick),
                }
            }
            [2, ..] => Plan::Idle,
            [3, ..] => Plan::Stop,
            other => bail!("unknown serving plan header {other:?} (ranks out of step)"),
        })
    }
}

/// Broadcasts `plan` from global rank 0 to the world (two broadcasts: header, payload).
fn broadcast(model: &GptModel, plan: Option<&Plan>) -> Result<Plan> {
    let ctx = model.parallel_context();
    let bk = model.backend();
    let (header, payload) = plan.map_or(([0; 4], Vec::new()), Plan::encode);
    let mut h = bk.from_host(HostBuffer::I32(header.to_vec()), &[4])?;
    ctx.comm.broadcast(&ctx.world_group, &mut h, 0).context("broadcasting the serving plan")?;
    let got = bk.to_host(&h)?;
    let HostBuffer::I32(g) = got else { bail!("serving plan header came back as {:?}", got.dtype()) };
    let header = [g[0], g[1], g[2], g[3]];
    let n = Plan::payload_len(header);
    if n == 0 {
        return Plan::decode(header, &[]);
    }
    let mut p =
        if plan.is_some() { bk.from_host(HostBuffer::I32(payload), &[n])? } else { bk.zeros(&[n], DType::I32)? };
    ctx.comm.broadcast(&ctx.world_group, &mut p, 0).context("broadcasting the serving plan")?;
    match bk.to_host(&p)? {
        HostBuffer::I32(v) => Plan::decode(header, &v),
        other => bail!("serving plan payload came back as {:?}", other.dtype()),
    }
}

/// The driver's side: rank 0 of a world of more than one rank.
pub struct Driver {
    last: Instant,
}

impl Driver {
    /// `Some` when `model` is one shard of several (it must be global rank 0's).
    pub fn for_model(model: &GptModel) -> Result<Option<Driver>> {
        let ctx: &ParallelContext = model.parallel_context();
        if ctx.world_size() == 1 {
            return Ok(None);
        }
        if ctx.rank != 0 {
            bail!("the serving engine runs on global rank 0; rank {} must run `follow`", ctx.rank);
        }
        if ctx.dp_size() != 1 || ctx.grid.cp != 1 {
            bail!(
                "serving runs one model replica: --nproc must equal tensor x pipeline parallel size (got dp {}, cp {})",
                ctx.dp_size(),
                ctx.grid.cp
            );
        }
        Ok(Some(Driver { last: Instant::now() }))
    }

    /// Sends `plan` to the followers.
    pub fn send(&mut self, model: &GptModel, plan: &Plan) -> Result<()> {
        self.last = Instant::now();
        broadcast(model, Some(plan)).map(|_| ())
    }

    /// An [`Plan::Idle`] if the followers have heard nothing for [`HEARTBEAT`].
    pub fn heartbeat(&mut self, model: &GptModel) -> Result<()> {
        if self.last.elapsed() >= HEARTBEAT {
            self.send(model, &Plan::Idle)?;
        }
        Ok(())
    }

    /// Tells the followers to stop (they return from [`follow`]).
    pub fn stop(&mut self, model: &GptModel) {
        let _ = self.send(model, &Plan::Stop);
    }

    /// Runs `forward_slots_with` on every rank; the driver gets the logits.
    pub fn forward(&mut self, model: &mut GptModel, call: &SlotCall, cache: &mut SlotKvCache) -> Result<Vec<f32>> {
        let offsets = call.slots.iter().map(|&s| cache.len(s)).collect();
        let plan = Plan::Forward {
            slots: call.slots.to_vec(),
            offsets,
            tokens: call.tokens.to_vec(),
            valid: call.valid.to_vec(),
            pick: call.pick.to_vec(),
        };
        self.send(model, &plan)?;
        model.forward_slots_with(call, cache)
    }
}

/// A follower rank: makes the driver's model calls on this rank's shard until [`Plan::Stop`].
/// An error or a panic aborts the world (the driver's next call fails with it) and is returned.
pub fn follow(model: &mut GptModel) -> Result<()> {
    // A panic must abort the world too, or the driver would wait for this rank until the timeout.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| follow_plans(model))).unwrap_or_else(|p| {
        let what = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
        Err(anyhow::anyhow!("panicked: {}", what.unwrap_or_else(|| "a non-string panic payload".into())))
    });
    if let Err(e) = &r {
        let ctx = model.parallel_context();
        ctx.comm.abort(&format!("serving rank {} failed: {e:#}", ctx.rank));
    }
    r
}

fn follow_plans(model: &mut GptModel) -> Result<()> {
    let mut cache: Option<SlotKvCache> = None;
    loop {
        match broadcast(model, None)? {
            Plan::Init { slots, capacity } => cache = Some(model.new_slot_kv_cache(slots, capacity)?),
            Plan::Forward { slots, offsets, tokens, valid, pick } => {
                let Some(cache) = cache.as_mut() else { bail!("a forward plan came before the cache was made") };
                for (&s, &o) in slots.iter().zip(&offsets) {
                    if s >= cache.slots() {
                        bail!("plan names slot {s} of {}", cache.slots());
                    }
                    if o == 0 {
                        cache.free(s);
                    } else if cache.len(s) != o {
                        bail!("slot {s} holds {} tokens here but {o} on the driver: ranks out of step", cache.len(s));
                    }
                }
                // A failed call fails the same way on the driver (same checks, same inputs), or
                // leaves a collective the driver waits in: then the abort above releases it.
                model.forward_slots_with(
                    &SlotCall { tokens: &tokens, slots: &slots, valid: &valid, pick: &pick },
                    cache,
                )?;
            }
            Plan::Idle => {}
            Plan::Stop => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_round_trip() {
        let plans = [
            Plan::Init { slots: 4, capacity: 128 },
            Plan::Forward {
                slots: vec![2, 0],
                offsets: vec![5, 0],
                tokens: vec![7, 8, 9, 10],
                valid: vec![2, 1],
                pick: vec![1, 2],
            },
            Plan::Idle,
            Plan::Stop,
        ];
        for p in plans {
            let (h, payload) = p.encode();
            assert_eq!(Plan::payload_len(h), payload.len());
            assert_eq!(Plan::decode(h, &payload).unwrap(), p);
        }
        assert!(Plan::decode([9, 0, 0, 0], &[]).is_err());
    }
}
