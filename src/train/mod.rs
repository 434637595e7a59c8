//! The training driver of `megatron pretrain` (ARCHITECTURE.md "Data flow"): builds the
//! plugins from one validated config, loads a checkpoint, runs the iterations with logging,
//! evaluation, checkpoint cadence and exit conditions (SPEC §6.2, §6.12).

mod checkpointing;
pub mod comm_timing;
pub mod data;
pub mod log;
pub mod memory;
mod mpi_rank;
mod multi_rank;
mod setup;
mod step;

use crate::config::TrainConfig;
use anyhow::Result;
use data::DataCursor;
use megatron_core::{
    Backend, GradSync, LrSchedule, MetricsSink, Model, Optimizer, ParallelContext, ParallelStrategy, ReduceOp, Schedule,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

pub use mpi_rank::run_mpi_rank;
pub use multi_rank::run_ranks;
pub use setup::{build_trainer, build_trainer_with_comm};

/// Counters that a checkpoint restores.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct TrainState {
    pub iteration: u64,
    pub consumed_train_samples: u64,
    pub consumed_valid_samples: u64,
    /// Skipped and NaN iterations since the last log line (Megatron resets them per interval).
    pub skipped_iters: u64,
    pub nan_iters: u64,
    pub num_floating_point_operations_so_far: f64,
}

/// Everything one rank needs to train.
pub struct Trainer {
    pub cfg: TrainConfig,
    pub backend: Arc<dyn Backend>,
    pub ctx: ParallelContext,
    pub strategy: Box<dyn ParallelStrategy>,
    pub model: Box<dyn Model>,
    pub optimizer: Box<dyn Optimizer>,
    pub lr_schedule: Box<dyn LrSchedule>,
    pub schedule: Box<dyn Schedule>,
    /// The strategy's data-parallel gradient reducer (buckets, overlap); `None`: the
    /// strategy's `reduce_gradients` after backward.
    pub grad_sync: Option<Box<dyn GradSync>>,
    pub train: Option<DataCursor>,
    pub valid: Option<DataCursor>,
    pub test: Option<DataCursor>,
    pub sinks: Vec<Box<dyn MetricsSink>>,
    pub state: TrainState,
    pub tokenizer_fingerprint: String,
    /// Set by SIGINT/SIGTERM: save and exit after the current iteration.
    pub stop: Arc<AtomicBool>,
}

/// What a run did (for tests and the CLI's exit message).
#[derive(Clone, Debug, Default)]
pub struct TrainSummary {
    /// `(iteration, lm loss)` of every iteration run by this process.
    pub losses: Vec<(u64, f64)>,
    /// `(iteration, gradient norm)` of every iteration run by this process.
    pub grad_norms: Vec<(u64, f64)>,
    /// `(iteration, validation loss)` of every evaluation.
    pub valid_losses: Vec<(u64, f64)>,
    pub final_iteration: u64,
    pub stopped_by_signal: bool,
    pub saved: Vec<u64>,
}

impl Trainer {
    fn is_logging_rank(&self) -> bool {
        self.ctx.rank + 1 == self.ctx.world_size()
    }

    /// Megatron's `print_rank_0` messages (checkpointing, exit reasons).
    fn is_rank0(&self) -> bool {
        self.ctx.rank == 0
    }

    /// Whether any rank was signalled or ran over time: every rank must stop together.
    fn agree_to_stop(&self, signalled: bool, over_time: bool) -> Result<(bool, bool)> {
        let mut flags = [f64::from(u8::from(signalled)), f64::from(u8::from(over_time))];
        self.ctx.comm.all_reduce_f64(&self.ctx.world_group, &mut flags, ReduceOp::Max)?;
        Ok((flags[0] > 0.0, flags[1] > 0.0))
    }

    fn emit(&mut self, tag: &str, value: f64) -> Result<()> {
        let (it, samples) = (self.state.iteration, self.state.consumed_train_samples);
        for s in &mut self.sinks {
            s.scalar(tag, value, it, samples)?;
        }
        Ok(())
    }

    /// Runs until `--train-iters`, an exit condition or a signal (SPEC §6.12).
    pub fn train(&mut self) -> Result<TrainSummary> {
        let args = self.cfg.args.clone();
        let gbs = self.cfg.global_batch_size;
        let start_time = Instant::now();
        let progress = log::Progress::new(self.state.iteration);
        let mut summary = TrainSummary::default();
        let (mut interval_start, mut interval_iters) = (Instant::now(), 0u64);
        let (mut loss_sum, mut loss_count, mut last_norm) = (0.0f64, 0u64, None);
        let mut last_saved = None;
        while self.state.iteration < args.train_iters {
            let step = self.train_step()?;
            self.state.iteration += 1;
            self.state.consumed_train_samples += gbs as u64;
            let flops = self.model.flops_per_iteration(gbs);
            self.state.num_floating_point_operations_so_far += flops;
            interval_iters += 1;
            if step.skipped {
                self.state.skipped_iters += 1;
                if !step.loss.is_finite() {
                    self.state.nan_iters += 1;
                }
            } else {
                loss_sum += step.loss;
                loss_count += 1;
                last_norm = Some(step.grad_norm);
            }
            summary.losses.push((self.state.iteration, step.loss));
            summary.grad_norms.push((self.state.iteration, step.grad_norm));
            let it = self.state.iteration;
            if self.is_logging_rank() {
                self.emit("lm loss", step.loss)?;
                self.emit("learning-rate", step.lr)?;
                self.emit("batch-size", gbs as f64)?;
                self.emit("grad-norm", step.grad_norm)?;
            }
            if it.is_multiple_of(args.log_interval) {
                let secs = interval_start.elapsed().as_secs_f64() / interval_iters as f64;
                let line = log::LogLine {
                    iteration: it,
                    train_iters: args.train_iters,
                    consumed_samples: self.state.consumed_train_samples,
                    elapsed_ms_per_iter: secs * 1e3,
                    tflops: flops / (secs * 1e12 * self.ctx.world_size() as f64),
                    lr: self.lr_schedule.lr(),
                    global_batch_size: gbs,
                    lm_loss: if loss_count > 0 { loss_sum / loss_count as f64 } else { 0.0 },
                    loss_scale: 1.0,
                    grad_norm: last_norm,
                    skipped_iters: self.state.skipped_iters,
                    nan_iters: self.state.nan_iters,
                };
                if self.is_logging_rank() {
                    progress.clear();
                    println!("{}", line.render(&log::timestamp()));
                    self.emit("iteration-time", secs)?;
                    self.emit("throughput", line.tflops)?;
                    self.emit("tokens-per-second", (gbs * args.seq_length) as f64 / secs)?;
                    for s in &mut self.sinks {
                        s.flush()?;
                    }
                }
                (interval_start, interval_iters, loss_sum, loss_count) = (Instant::now(), 0, 0.0, 0);
                (self.state.skipped_iters, self.state.nan_iters) = (0, 0);
            }
            if it.is_multiple_of(args.eval_interval) && args.eval_iters > 0 {
                if let Some(loss) = self.run_validation(&format!("iteration {it}"))? {
                    summary.valid_losses.push((it, loss));
                }
            }
            progress.update(it, args.train_iters);
            // Exit conditions in Megatron's order (SPEC §6.12).
            let signalled = self.stop.load(Ordering::SeqCst);
            if let (Some(_), Some(interval)) = (&args.save, args.save_interval) {
                if it.is_multiple_of(interval) {
                    self.save()?;
                    last_saved = Some(it);
                }
            }
            let over_time = args.exit_duration_in_mins.is_some_and(|m| start_time.elapsed().as_secs_f64() > m * 60.0);
            let (signalled, over_time) = self.agree_to_stop(signalled, over_time)?;
            let at_exit_interval = args.exit_interval.is_some_and(|n| n > 0 && it.is_multiple_of(n));
            if signalled || over_time || at_exit_interval {
                progress.clear();
                if args.save.is_some() && last_saved != Some(it) {
                    self.save()?;
                    last_saved = Some(it);
                }
                let why = if signalled {
                    "a signal"
                } else if over_time {
                    "--exit-duration-in-mins"
                } else {
                    "--exit-interval"
                };
                if self.is_rank0() {
                    println!("exiting after iteration {it} because of {why}");
                }
                summary.stopped_by_signal = signalled;
                summary.final_iteration = it;
                summary.saved.extend(last_saved);
                return Ok(summary);
            }
        }
        progress.clear();
        let it = self.state.iteration;
        if args.save.is_some() && last_saved != Some(it) {
            self.save()?;
            last_saved = Some(it);
        }
        summary.saved.extend(last_saved);
        summary.final_iteration = it;
        // Final evaluations (SPEC §6.2): validation, then test.
        if args.eval_iters > 0 {
            if let Some(loss) = self.run_validation(&format!("iteration {it} on validation set"))? {
                summary.valid_losses.push((it, loss));
            }
            self.run_test(&format!("iteration {it} on test set"))?;
        }
        for s in &mut self.sinks {
            s.flush()?;
        }
        Ok(summary)
    }

    fn run_validation(&mut self, label: &str) -> Result<Option<f64>> {
        let Some(cursor) = self.valid.clone() else { return Ok(None) };
        let (loss, used) = self.evaluate(&cursor, self.state.consumed_valid_samples, self.cfg.args.eval_iters)?;
        self.state.consumed_valid_samples += used;
        if self.is_logging_rank() {
            println!("{}", log::validation_block(label, loss));
            self.emit("lm loss validation", loss)?;
            self.emit("lm loss validation ppl", loss.min(20.0).exp())?;
        }
        Ok(Some(loss))
    }

    fn run_test(&mut self, label: &str) -> Result<()> {
        let Some(cursor) = self.test.clone() else { return Ok(()) };
        let (loss, _) = self.evaluate(&cursor, 0, self.cfg.args.eval_iters)?;
        if self.is_logging_rank() {
            println!("{}", log::validation_block(label, loss));
        }
        Ok(())
    }
}
