//! The training guards hook (logic in the `megatron-guards` crate). After the gradient norm:
//!
//! * a non-finite loss or norm (the step is skipped, as Megatron does) is diagnosed: the first
//!   parameter in model order whose gradient is non-finite (its layer, how many elements), and
//!   — replaying the iteration's microbatches one at a time (pp = 1) — the first microbatch
//!   that produces it alone and its dataset sample indices. `--on-nan stop` then ends the run
//!   with that diagnosis, `skip` (the default) goes on, `rewind` goes back to the last
//!   checkpoint and skips the global batch from then on (src/train/rewind.rs).
//! * `--log-per-layer-grad-norms` prints each layer's gradient norm at every log interval.
//!
//! Cost: healthy steps pay nothing beyond the grad norm already computed; a bad step pays one
//! host copy of the gradients and `M` forward/backward replays; the per-layer table pays one
//! host copy of the gradients per log interval.
//!
//! `--inject-nan-grad ITER:MB:PARAM` (hidden, tests only) writes a NaN into `PARAM`'s gradient
//! at iteration `ITER` (1-based, as logged) — in the step and in the replay of microbatch `MB`.

use super::data::microbatch_seed;
use super::Trainer;
use anyhow::{bail, Context, Result};
use megatron_core::{Mode, Param};
use megatron_guards::{first_non_finite, layer_grad_norms, BadGrad};

/// The parsed `--inject-nan-grad`.
struct Injection {
    iteration: u64,
    microbatch: usize,
    param: String,
}

fn injection(spec: &Option<String>) -> Result<Option<Injection>> {
    let Some(s) = spec else { return Ok(None) };
    let mut parts = s.splitn(3, ':');
    let (Some(it), Some(mb), Some(param)) = (parts.next(), parts.next(), parts.next()) else {
        bail!("--inject-nan-grad `{s}`: expected ITER:MICROBATCH:PARAM");
    };
    Ok(Some(Injection {
        iteration: it.parse().with_context(|| format!("--inject-nan-grad `{s}`: bad iteration"))?,
        microbatch: mb.parse().with_context(|| format!("--inject-nan-grad `{s}`: bad microbatch"))?,
        param: param.to_string(),
    }))
}

fn host_grads(t: &Trainer) -> Result<Vec<(String, Vec<f32>)>> {
    t.model.params().iter().map(|p| Ok((p.name.clone(), t.backend.to_host(&p.grad)?.to_f32_vec()))).collect()
}

impl Trainer {
    /// Test hook: the NaN of `--inject-nan-grad` for `iteration` (1-based) and, in a replay,
    /// microbatch `replay`.
    pub(super) fn guard_inject(&mut self, iteration: u64, replay: Option<usize>) -> Result<()> {
        let Some(inj) = injection(&self.cfg.args.inject_nan_grad)? else { return Ok(()) };
        if inj.iteration != iteration || replay.is_some_and(|mb| mb != inj.microbatch) {
            return Ok(());
        }
        let backend = self.backend.clone();
        let mut params = self.model.params_mut();
        let Some(p): Option<&mut &mut Param> = params.iter_mut().find(|p| p.name == inj.param) else {
            return Ok(()); // another pipeline stage holds it
        };
        let mut g = backend.to_host(&p.grad)?.to_f32_vec();
        g[0] = f32::NAN;
        let shape = p.grad.shape().to_vec();
        let t = backend.from_host(megatron_core::HostBuffer::F32(g), &shape)?;
        backend.copy(&t, &mut p.grad)
    }

    /// The guards after the gradient norm of iteration `iteration` (1-based), whose global
    /// batch starts at sample `consumed`: `Ok(true)` when the update must not be applied
    /// (a spike under skip/rewind; a non-finite step is skipped anyway).
    pub(super) fn guard_after_backward(&mut self, iteration: u64, consumed: u64, loss: f64, norm: f64) -> Result<bool> {
        let args = self.cfg.args.clone();
        if args.log_per_layer_grad_norms && iteration.is_multiple_of(args.log_interval.max(1)) && loss.is_finite() {
            let grads = host_grads(self)?;
            let (sq, _) = first_non_finite(grads.iter().map(|(n, g)| (n.as_str(), g.as_slice())));
            let table = layer_grad_norms(grads.iter().map(|(n, _)| n.as_str()).zip(sq));
            if self.ctx.rank == 0 {
                let rows: Vec<String> = table.iter().map(|(g, n)| format!("{g}: {n:.4e}")).collect();
                println!(" per-layer grad norms (rank 0's shards) at iteration {iteration}: {}", rows.join(" | "));
            }
        }
        if loss.is_finite() && norm.is_finite() {
            // Spikes (src/train/rewind.rs).
            return self.guard_spikes(iteration, consumed, loss, norm);
        }
        let grads = host_grads(self)?;
        let (_, bad) = first_non_finite(grads.iter().map(|(n, g)| (n.as_str(), g.as_slice())));
        let culprit = self.replay_microbatches(iteration, consumed)?;
        let what = describe(iteration, loss, norm, bad.as_ref(), culprit);
        match args.on_nan.as_str() {
            "stop" => bail!("{what} (--on-nan stop)"),
            "rewind" => self.guard_request_rewind(iteration, consumed, what),
            _ => println!(" guard: {what}; update skipped (--on-nan skip)"),
        }
        Ok(true)
    }

    /// Replays microbatches one at a time (pp = 1): `(microbatch, first sample, samples, first
    /// bad parameter)` of the first whose loss or gradients are non-finite alone.
    fn replay_microbatches(&mut self, iteration: u64, consumed: u64) -> Result<Option<(usize, u64, usize, String)>> {
        if self.ctx.pp_size() > 1 {
            return Ok(None);
        }
        let Some(cursor) = self.train.clone() else { return Ok(None) };
        let (mbs, dp, dp_rank) = (self.cfg.args.micro_batch_size, self.cfg.data_parallel_size, self.ctx.dp_rank);
        for mb in 0..self.cfg.num_microbatches {
            self.model.zero_grad()?;
            let batch = cursor.microbatch(consumed, mb, microbatch_seed(self.cfg.args.seed, iteration - 1, mb))?;
            let report = self.model.forward(&batch, Mode::Train)?;
            self.model.backward(1.0)?;
            self.guard_inject(iteration, Some(mb))?;
            let grads = host_grads(self)?;
            let (_, bad) = first_non_finite(grads.iter().map(|(n, g)| (n.as_str(), g.as_slice())));
            if bad.is_some() || !report.loss_sum.is_finite() {
                let start = consumed + (mb * mbs * dp + dp_rank * mbs) as u64;
                return Ok(Some((mb, start, mbs, bad.map_or("(loss only)".into(), |b| b.name))));
            }
        }
        Ok(None)
    }
}

fn describe(
    iteration: u64,
    loss: f64,
    norm: f64,
    bad: Option<&BadGrad>,
    culprit: Option<(usize, u64, usize, String)>,
) -> String {
    let mut s = format!("non-finite at iteration {iteration} (loss {loss}, grad norm {norm})");
    match bad {
        Some(b) => {
            let layer = b.layer.map_or("outside the decoder layers".to_string(), |l| format!("layer {l}"));
            s += &format!(": first bad gradient `{}` ({layer}, {} of {} elements)", b.name, b.non_finite, b.numel);
        }
        None => s += ": every gradient is finite (the loss alone is not)",
    }
    match culprit {
        Some((mb, start, n, param)) => {
            s += &format!(
                "; microbatch {mb} reproduces it alone (samples {start}..{}, first bad `{param}`)",
                start + n as u64
            )
        }
        None => s += "; no single microbatch reproduces it (or pp > 1: not replayed)",
    }
    s
}
