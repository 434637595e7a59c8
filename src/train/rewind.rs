//! Spike detection and the `rewind` policy (issue 19; logic in the `megatron-guards` crate).
//!
//! * `--spike-threshold` / `--grad-norm-spike-threshold`: after the gradient norm and before
//!   the update, the iteration's loss and norm are judged against the last `--spike-window`
//!   healthy iterations (z-score against their robust linear trend, or their mean with
//!   `--spike-score mean`). A spike is handled by `--on-spike`: `skip` drops the update,
//!   `stop` ends the run, `rewind` (also `--on-nan rewind`) drops the update and then, between
//!   iterations, reloads the last checkpoint (`--save`, else `--load`), adds the offending
//!   global batch's samples to `--skip-train-samples` and saves that checkpoint again so the
//!   list is recorded where a resumed run finds it.
//! * A global batch holding a listed sample is consumed without training (Megatron's
//!   `--iterations-to-skip` dummy step: the iteration and consumed-samples counters advance,
//!   the LR schedule does not), so the replay after a rewind — and any run resumed from a
//!   checkpoint that carries the list — never trains on it again.
//!
//! Cost: two z-scores per iteration (the trend fit is O(window²) on the host: microseconds); a rewind costs one checkpoint load and one save.

use super::{TrainSummary, Trainer};
use anyhow::{bail, Result};
use megatron_guards::{SkipList, SpikeGuards};

/// More rewinds than this in one process means the trouble is not in the data.
const MAX_REWINDS: usize = 16;

/// Per-run guard state kept on the [`Trainer`].
#[derive(Default)]
pub struct GuardState {
    spikes: Option<SpikeGuards>,
    /// Set by the step that found the trouble; carried out by the driver between iterations.
    pending: Option<PendingRewind>,
    rewinds: usize,
}

struct PendingRewind {
    iteration: u64,
    first_sample: u64,
    why: String,
}

/// One rewind, for tests and the run summary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rewind {
    /// The iteration (1-based) whose batch was bad.
    pub iteration: u64,
    /// The checkpoint iteration the run went back to.
    pub back_to: u64,
    /// The global batch's samples, now on the skip list.
    pub samples: std::ops::Range<u64>,
}

fn skip_list(samples: &[u64]) -> SkipList {
    let mut s = SkipList::default();
    s.add(samples.iter().copied());
    s
}

impl Trainer {
    /// The spike verdict for an iteration with finite `loss` and `norm`: `Ok(true)` when its
    /// update must not be applied (skip or rewind), an error for `--on-spike stop`.
    pub(super) fn guard_spikes(&mut self, iteration: u64, consumed: u64, loss: f64, norm: f64) -> Result<bool> {
        let a = &self.cfg.args;
        let (window, z) = (a.spike_window, a.spike_threshold);
        let score = megatron_guards::SpikeScore::parse(&a.spike_score).map_err(anyhow::Error::msg)?;
        let guards = self
            .guard
            .spikes
            .get_or_insert_with(|| SpikeGuards::with_score(window, z, a.grad_norm_spike_threshold, score));
        let Some(verdict) = guards.check_at(iteration, loss, norm) else { return Ok(false) };
        let threshold = match verdict {
            megatron_guards::SpikeVerdict::Loss(_) => z.unwrap_or_default(),
            megatron_guards::SpikeVerdict::GradNorm(_) => a.grad_norm_spike_threshold.unwrap_or_default(),
        };
        let (gbs, policy) = (self.cfg.global_batch_size as u64, a.on_spike.clone());
        let what = format!(
            "{} at iteration {iteration} (samples {consumed}..{})",
            verdict.describe_scored(window, threshold, score),
            consumed + gbs
        );
        match policy.as_str() {
            "stop" => bail!("{what} (--on-spike stop)"),
            "rewind" => self.guard_request_rewind(iteration, consumed, what),
            _ => {
                if self.is_rank0() {
                    println!(" guard: {what}; update skipped (--on-spike skip)");
                }
            }
        }
        Ok(true)
    }

    /// Marks the iteration for a rewind once its step returns.
    pub(super) fn guard_request_rewind(&mut self, iteration: u64, first_sample: u64, why: String) {
        self.guard.pending = Some(PendingRewind { iteration, first_sample, why });
    }

    /// Top of an iteration: consumes a global batch on the skip list without training on it.
    /// Returns whether it did.
    pub(super) fn guard_skip_listed(&mut self, summary: &mut TrainSummary) -> Result<bool> {
        let a = &self.cfg.args;
        if a.skip_train_samples.is_empty() {
            return Ok(false);
        }
        let (start, gbs) = (self.state.consumed_train_samples, self.cfg.global_batch_size as u64);
        if !skip_list(&a.skip_train_samples).any_in(start, gbs) {
            return Ok(false);
        }
        self.state.iteration += 1;
        self.state.consumed_train_samples += gbs;
        summary.skipped_batches.push(self.state.iteration);
        if self.is_rank0() {
            println!(
                " guard: iteration {} not trained: samples {start}..{} hold a sample of --skip-train-samples",
                self.state.iteration,
                start + gbs
            );
        }
        Ok(true)
    }

    /// After a step: carries out a pending rewind. Returns whether it did.
    pub(super) fn guard_rewind(&mut self, summary: &mut TrainSummary) -> Result<bool> {
        let Some(p) = self.guard.pending.take() else { return Ok(false) };
        self.guard.rewinds += 1;
        if self.guard.rewinds > MAX_REWINDS {
            bail!("{}; {MAX_REWINDS} rewinds already in this run: the trouble is not in the data, stopping", p.why);
        }
        let gbs = self.cfg.global_batch_size as u64;
        let samples = p.first_sample..p.first_sample + gbs;
        let a = self.cfg.args.clone();
        let has_checkpoint = |d: &Option<std::path::PathBuf>| -> Result<Option<std::path::PathBuf>> {
            Ok(match d {
                Some(d) if d.is_dir() && megatron_checkpoint::read_tracker(d)?.is_some() => Some(d.clone()),
                _ => None,
            })
        };
        let Some(dir) = has_checkpoint(&a.save)?.or(has_checkpoint(&a.load)?) else {
            bail!(
                "{}; rewind needs a checkpoint to go back to but neither --save nor --load holds one yet \
                 (save earlier with --save-interval, or use skip)",
                p.why
            );
        };
        // Reload with the plain resume path; a weights-only or optimizer-less load would not
        // restore the run.
        let mut skip = a.skip_train_samples.clone();
        skip.extend(samples.clone());
        self.cfg.args.load = Some(dir.clone());
        self.cfg.args.finetune = false;
        self.cfg.args.no_load_optim = false;
        self.cfg.args.no_load_rng = false;
        self.cfg.args.skip_train_samples = skip;
        let loaded = self.maybe_load();
        let merged = std::mem::take(&mut self.cfg.args.skip_train_samples);
        self.cfg.args = a;
        self.cfg.args.skip_train_samples = merged;
        loaded?;
        // The detectors forget the iterations the rewind undid (their replay comes again).
        if let Some(g) = &mut self.guard.spikes {
            g.forget_after(self.state.iteration);
        }
        if self.is_rank0() {
            println!(
                " guard: {}; rewound to iteration {} of {}, samples {}..{} are skipped from now on",
                p.why,
                self.state.iteration,
                dir.display(),
                samples.start,
                samples.end
            );
        }
        // Record the skip list in the checkpoint the run went back to.
        self.save()?;
        summary.rewinds.push(Rewind { iteration: p.iteration, back_to: self.state.iteration, samples });
        Ok(true)
    }

    /// On load: the checkpoint's skip list joins this run's.
    pub(super) fn guard_merge_skip_list(&mut self, stored_args: &serde_json::Value) {
        let stored = stored_args["skip_train_samples"].as_array().map(|v| v.iter().filter_map(|x| x.as_u64()));
        let list = &mut self.cfg.args.skip_train_samples;
        list.extend(stored.into_iter().flatten());
        list.sort_unstable();
        list.dedup();
    }
}
