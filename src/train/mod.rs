//! The training driver of `megatron pretrain` (ARCHITECTURE.md "Data flow"): builds the
//! plugins from one validated config, loads a checkpoint, runs the iterations with logging,
//! evaluation, checkpoint cadence and exit conditions (SPEC §6.2, §6.12).

mod checkpointing;
pub mod comm_timing;
mod compute_probe;
pub mod data;
mod guards;
pub mod log;
mod loss_scaling;
pub mod memory;
mod mpi_rank;
mod multi_rank;
pub mod param_gather;
pub mod rewind;
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
    /// The fp16 loss scaler (or `--loss-scale` with bf16); `None` otherwise (SPEC §6.7).
    pub loss_scaler: Option<megatron_optim::LossScaler>,
    /// Spike detectors and a pending rewind (src/train/rewind.rs).
    pub guard: rewind::GuardState,
    /// `--overlap-param-gather` (src/train/param_gather.rs); `None` without it.
    pub param_gather: Option<param_gather::OverlapParamGather>,
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
    /// Rewinds to a checkpoint (`--on-nan rewind`, `--on-spike rewind`).
    pub rewinds: Vec<rewind::Rewind>,
    /// Iterations consumed without training (their batch is on `--skip-train-samples`).
    pub skipped_batches: Vec<u64>,
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

    fn emit_at_step(&mut self, tag: &str, value: f64) -> Result<()> {
        let it = self.state.iteration;
        for s in &mut self.sinks {
            s.scalar_at_step(tag, value, it)?;
        }
        Ok(())
    }

    /// Megatron's `write_args_to_tensorboard`: every argument as a text summary
    /// `add_text(name, str(value))` at the starting iteration.
    fn write_args(&mut self) -> Result<()> {
        let serde_json::Value::Object(args) = serde_json::to_value(&self.cfg.args)? else { return Ok(()) };
        let it = self.state.iteration;
        for (name, value) in &args {
            let text = python_str(value);
            for s in &mut self.sinks {
                s.text(name, &text, it)?;
            }
        }
        Ok(())
    }

    /// Runs until `--train-iters`, an exit condition or a signal (SPEC §6.12).
    pub fn train(&mut self) -> Result<TrainSummary> {
        if self.is_logging_rank() {
            self.write_args()?;
        }
        let args = self.cfg.args.clone();
        let gbs = self.cfg.global_batch_size;
        let start_time = Instant::now();
        let progress = log::Progress::new(self.state.iteration);
        let mut summary = TrainSummary::default();
        let (mut interval_start, mut interval_iters) = (Instant::now(), 0u64);
        let (mut loss_sum, mut loss_count) = (0.0f64, 0u64);
        let mut last_saved = None;
        let mut model_metrics = log::ModelMetrics::default();
        while self.state.iteration < args.train_iters {
            if self.guard_skip_listed(&mut summary)? {
                continue;
            }
            let step = self.train_step()?;
            if self.guard_rewind(&mut summary)? {
                continue;
            }
            model_metrics.add(self.model.take_metrics());
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
            }
            summary.losses.push((self.state.iteration, step.loss));
            summary.grad_norms.push((self.state.iteration, step.grad_norm));
            let it = self.state.iteration;
            if self.is_logging_rank() && it.is_multiple_of(args.tensorboard_log_interval) {
                // Megatron's training_log order and flags. The learning rate is read after the
                // scheduler stepped (the console line shows the same value).
                self.emit("learning-rate", self.lr_schedule.lr())?;
                self.emit("batch-size", gbs as f64)?;
                self.emit("lm loss", step.loss)?;
                if args.log_loss_scale_to_tensorboard {
                    // Without loss scaling (fp32, bf16) Megatron's scale is 1.0.
                    self.emit("loss-scale", self.loss_scale())?;
                }
                if args.log_world_size_to_tensorboard {
                    self.emit("world-size", self.ctx.world_size() as f64)?;
                }
                if !step.skipped {
                    // A skipped update has no gradient norm (Megatron logs none).
                    self.emit("grad-norm", step.grad_norm)?;
                }
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
                    loss_scale: self.loss_scale(),
                    // The last iteration's norm, none when it was skipped (Megatron).
                    grad_norm: (!step.skipped).then_some(step.grad_norm),
                    skipped_iters: self.state.skipped_iters,
                    nan_iters: self.state.nan_iters,
                };
                if self.is_logging_rank() {
                    progress.clear();
                    println!("{}{}", line.render(&log::timestamp()), model_metrics.render());
                    for (name, value) in model_metrics.averages() {
                        self.emit(&name, value)?;
                    }
                    if args.log_timers_to_tensorboard {
                        // Timers have no "vs samples" series in Megatron.
                        self.emit_at_step("iteration-time", secs)?;
                        if args.log_throughput {
                            self.emit_at_step("throughput", line.tflops)?;
                        }
                        // megatron-rs's own.
                        self.emit_at_step("tokens-per-second", (gbs * args.seq_length) as f64 / secs)?;
                    }
                    for s in &mut self.sinks {
                        s.flush()?;
                    }
                }
                (interval_start, interval_iters, loss_sum, loss_count) = (Instant::now(), 0, 0.0, 0);
                model_metrics = log::ModelMetrics::default();
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
                self.finish_param_gather()?;
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
        self.finish_param_gather()?;
        Ok(summary)
    }

    fn run_validation(&mut self, label: &str) -> Result<Option<f64>> {
        let Some(cursor) = self.valid.clone() else { return Ok(None) };
        self.model.take_eval_metrics();
        let (loss, used) = self.evaluate(&cursor, self.state.consumed_valid_samples, self.cfg.args.eval_iters)?;
        let extra = self.eval_metric_averages();
        self.state.consumed_valid_samples += used;
        if self.is_logging_rank() {
            println!("{}", log::validation_block_with(label, loss, &extra));
            self.emit("lm loss validation", loss)?;
            for (name, v) in &extra {
                self.emit(&format!("{name} validation"), *v)?;
                if self.cfg.args.log_validation_ppl_to_tensorboard {
                    self.emit(&format!("{name} validation ppl"), v.min(20.0).exp())?;
                }
            }
            if self.cfg.args.log_validation_ppl_to_tensorboard {
                self.emit("lm loss validation ppl", loss.min(20.0).exp())?;
            }
        }
        Ok(Some(loss))
    }

    fn run_test(&mut self, label: &str) -> Result<()> {
        let Some(cursor) = self.test.clone() else { return Ok(()) };
        self.model.take_eval_metrics();
        let (loss, _) = self.evaluate(&cursor, 0, self.cfg.args.eval_iters)?;
        let extra = self.eval_metric_averages();
        if self.is_logging_rank() {
            println!("{}", log::validation_block_with(label, loss, &extra));
        }
        Ok(())
    }

    /// The model's evaluation values of the pass just run (BERT's `sop loss`), each averaged
    /// over its microbatches as Megatron's `evaluate` averages every loss key.
    fn eval_metric_averages(&mut self) -> Vec<(String, f64)> {
        let mut m = log::ModelMetrics::default();
        m.add(self.model.take_eval_metrics());
        m.averages()
    }
}

/// Python's `str()` of an argument value as argparse holds it: `None`, `True`/`False`,
/// numbers, plain strings, lists as `[a, b]` with quoted strings.
fn python_str(v: &serde_json::Value) -> String {
    use serde_json::Value;
    fn repr(v: &Value) -> String {
        match v {
            Value::String(s) => format!("'{s}'"),
            other => python_str(other),
        }
    }
    match v {
        Value::Null => "None".into(),
        Value::Bool(b) => if *b { "True" } else { "False" }.into(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => python_float(f),
            _ => n.to_string(),
        },
        Value::String(s) => s.clone(),
        Value::Array(a) => format!("[{}]", a.iter().map(repr).collect::<Vec<_>>().join(", ")),
        Value::Object(m) => {
            format!("{{{}}}", m.iter().map(|(k, v)| format!("'{k}': {}", repr(v))).collect::<Vec<_>>().join(", "))
        }
    }
}

/// Python's `repr(float)`: the shortest round-trip digits, fixed notation for decimal exponents
/// in `-4..16` (always with a fractional part), else `d.ddde±XX`.
fn python_float(f: f64) -> String {
    if !f.is_finite() {
        return if f.is_nan() {
            "nan".into()
        } else if f > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    let sci = format!("{f:e}"); // shortest digits, e.g. "-1.5e-5", "3e0"
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let (int, frac) = if point <= 0 {
            ("0".to_string(), format!("{}{digits}", "0".repeat((-point) as usize)))
        } else if point as usize >= digits.len() {
            (format!("{digits}{}", "0".repeat(point as usize - digits.len())), String::new())
        } else {
            (digits[..point as usize].to_string(), digits[point as usize..].to_string())
        };
        let frac = if frac.is_empty() { "0".to_string() } else { frac };
        format!("{sign}{int}.{frac}")
    } else {
        let m = if digits.len() > 1 { format!("{}.{}", &digits[..1], &digits[1..]) } else { digits };
        format!("{sign}{m}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::{python_float, python_str};
    use serde_json::json;

    #[test]
    fn python_str_of_argument_values() {
        // Expected values are CPython's str() of the same objects.
        let cases = [
            (3e-3, "0.003"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1.0, "1.0"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456.789, "123456.789"),
            (0.95, "0.95"),
            (1.5e-8, "1.5e-08"),
        ];
        for (f, want) in cases {
            assert_eq!(python_float(f), want, "{f}");
        }
        assert_eq!(python_str(&json!(null)), "None");
        assert_eq!(python_str(&json!(true)), "True");
        assert_eq!(python_str(&json!(7)), "7");
        assert_eq!(python_str(&json!("cosine")), "cosine");
        assert_eq!(python_str(&json!(["a", 2])), "['a', 2]");
    }
}
