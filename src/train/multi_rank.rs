//! `megatron pretrain --nproc N`: N ranks as threads of this process, joined by the `local`
//! communicator. Each rank builds its own backend, model, optimizer and data cursor through
//! [`build_trainer_with_comm`] and trains; the CPU threads are split between the ranks.
//!
//! Failure handling: the first rank to fail (an error or a panic, caught here) records its
//! error and aborts the world, so its peers stop waiting in collectives at once instead of
//! timing out; the run's error names that rank.

use super::comm_timing::TimedCommunicator;
use super::{build_trainer, build_trainer_with_comm, TrainSummary};
use crate::config::TrainConfig;
use anyhow::{anyhow, Context, Result};
use megatron_core::{Communicator, Registry};
use serde_json::json;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Trains with `cfg.world_size` ranks; returns the summary of the last rank (Megatron's
/// logging rank, which holds the loss of the last pipeline stage).
pub fn run_ranks(mut cfg: TrainConfig, registry: &Registry, stop: Arc<AtomicBool>) -> Result<TrainSummary> {
    let n = cfg.world_size;
    if n == 1 {
        return build_trainer(cfg, registry, stop)?.train();
    }
    // Every rank gets its own backend thread pool: split the cores instead of oversubscribing.
    let total = cfg.args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |c| c.get()));
    cfg.args.threads = Some((total / n).max(1));
    let timeout_secs = cfg.args.distributed_timeout_minutes.saturating_mul(60);
    let comms = registry
        .communicators("local", json!({ "timeout_secs": timeout_secs }), n)
        .context("building the `local` communicator for --nproc")?;
    anyhow::ensure!(comms.len() == n, "the `local` communicator returned {} endpoints for {n} ranks", comms.len());
    let first_failure: Mutex<Option<(usize, String)>> = Mutex::new(None);
    let results: Vec<Result<TrainSummary>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(rank, comm)| {
                let (cfg, stop, first_failure) = (cfg.clone(), stop.clone(), &first_failure);
                std::thread::Builder::new()
                    .name(format!("rank{rank}"))
                    .spawn_scoped(s, move || run_rank(rank, cfg, registry, stop, comm.clone(), first_failure))
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| match h {
                Ok(h) => h.join().unwrap_or_else(|_| Err(anyhow!("rank {rank}: its thread panicked"))),
                Err(e) => Err(anyhow!("cannot start the thread of rank {rank}: {e}")),
            })
            .collect()
    });
    let failed = results.iter().filter(|r| r.is_err()).count();
    let first = first_failure.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some((rank, message)) = first {
        let others = failed.saturating_sub(1);
        let tail = if others > 0 {
            format!(" ({others} other rank(s) failed too, or were stopped because of it)")
        } else {
            String::new()
        };
        return Err(anyhow!("rank {rank} of {n} failed: {message}{tail}"));
    }
    let mut results = results;
    results.pop().unwrap_or_else(|| Err(anyhow!("no ranks ran")))
}

/// One rank's whole run; an error or panic is recorded (first one wins) and aborts the world.
fn run_rank(
    rank: usize,
    cfg: TrainConfig,
    registry: &Registry,
    stop: Arc<AtomicBool>,
    comm: Arc<dyn Communicator>,
    first_failure: &Mutex<Option<(usize, String)>>,
) -> Result<TrainSummary> {
    // `--timing-log-level >= 1`: time every communicator call of this rank (see comm_timing).
    let timed = (cfg.args.timing_log_level >= 1).then(|| Arc::new(TimedCommunicator::new(comm.clone())));
    let rank_comm: Arc<dyn Communicator> = match &timed {
        Some(t) => t.clone(),
        None => comm.clone(),
    };
    let run = catch_unwind(AssertUnwindSafe(|| {
        let mut trainer = build_trainer_with_comm(cfg, registry, stop, rank_comm)?;
        let start = Instant::now();
        let first = trainer.state.iteration;
        let summary = trainer.train()?;
        if let Some(t) = &timed {
            println!("{}", t.report(start.elapsed().as_secs_f64(), summary.final_iteration - first));
        }
        Ok(summary)
    }));
    let result = match run {
        Ok(r) => r,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string panic payload".into());
            Err(anyhow!("panicked: {what}"))
        }
    };
    if let Err(e) = &result {
        let message = format!("{e:#}");
        first_failure.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert((rank, message.clone()));
        comm.abort(&format!("rank {rank} failed: {message}"));
    }
    result
}
