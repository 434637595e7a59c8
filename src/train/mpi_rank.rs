//! `megatron pretrain` under `mpirun`/`srun` (`--distributed-backend mpi`): this process is
//! one rank of an MPI world. The world size comes from MPI, the config is validated against
//! it, and the rank trains with the `mpi` communicator exactly as a thread rank of `--nproc`
//! does with `local` (same trainer, same collectives, same results).
//!
//! Failure handling: a rank that fails (error or panic) prints `rank R of N failed: ...` and
//! aborts the MPI job (`MPI_Abort`), so its peers end at once instead of waiting for the
//! timeout; the launcher reports the abort.

use super::comm_timing::TimedCommunicator;
use super::{build_trainer_with_comm, TrainSummary};
use crate::args::PretrainArgs;
use crate::config::TrainConfig;
use anyhow::{anyhow, Context, Result};
use megatron_core::{Communicator, Registry};
use serde_json::json;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

/// Trains this process's rank of the MPI world; returns its summary.
pub fn run_mpi_rank(args: &PretrainArgs, registry: &Registry, stop: Arc<AtomicBool>) -> Result<TrainSummary> {
    let timeout_secs = args.distributed_timeout_minutes.saturating_mul(60);
    let comm = registry
        .communicators("mpi", json!({ "timeout_secs": timeout_secs }), 0)
        .context("building the `mpi` communicator")?
        .into_iter()
        .next()
        .context("the `mpi` communicator returned no endpoint")?;
    let (rank, n) = (comm.rank(), comm.world_size());
    let result = catch_unwind(AssertUnwindSafe(|| train(args, registry, stop, comm.clone())));
    let result = result.unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string panic payload".into());
        Err(anyhow!("panicked: {what}"))
    });
    if let Err(e) = &result {
        let message = format!("rank {rank} of {n} failed: {e:#}");
        eprintln!("error: {message}");
        comm.abort(&message); // ends every process of the job
    }
    result
}

fn train(
    args: &PretrainArgs,
    registry: &Registry,
    stop: Arc<AtomicBool>,
    comm: Arc<dyn Communicator>,
) -> Result<TrainSummary> {
    let (rank, n) = (comm.rank(), comm.world_size());
    let mut cfg = TrainConfig::from_args(args, n).context("the MPI world size is the launcher's process count")?;
    // One rank per process: use the cores the launcher bound this process to (the affinity
    // mask is what available_parallelism reports); --threads overrides.
    let bound = std::thread::available_parallelism().map_or(1, |c| c.get());
    cfg.args.threads = Some(args.threads.unwrap_or(bound));
    if rank == 0 {
        println!(
            "MPI world of {n} ranks (`{}` communicator), rank 0 uses {} threads ({bound} cores bound)",
            comm.name(),
            cfg.args.threads.unwrap_or(bound)
        );
    }
    let timed = (cfg.args.timing_log_level >= 1).then(|| Arc::new(TimedCommunicator::new(comm.clone())));
    let rank_comm: Arc<dyn Communicator> = match &timed {
        Some(t) => t.clone(),
        None => comm,
    };
    let mut trainer = build_trainer_with_comm(cfg, registry, stop, rank_comm)?;
    let start = Instant::now();
    let first = trainer.state.iteration;
    let summary = trainer.train()?;
    if let Some(t) = &timed {
        println!("{}", t.report(start.elapsed().as_secs_f64(), summary.final_iteration - first));
    }
    Ok(summary)
}
