//! `megatron serve --nproc N --tensor-model-parallel-size T --pipeline-model-parallel-size P`:
//! loads the checkpoint once per rank (ranks as threads of this process, joined by the
//! `local` communicator), each rank its own shard. Rank 0's shard runs the engine, the others
//! follow it (see [`megatron_serving::ranks`]). One model replica: N = T x P.

use crate::generate::{load_model_on, LoadArgs, LoadedModel};
use anyhow::{anyhow, bail, Context, Result};
use megatron_core::{RankGrid, Registry};
use megatron_gpt::GptModel;
use serde_json::json;

/// How long a rank waits for its peers in one collective. The engine's heartbeat keeps idle
/// waits far below it; a model call longer than this fails.
const TIMEOUT_SECS: u64 = 600;

/// Rank 0's loaded model and every other rank's shard, in rank order.
pub fn load_ranks(
    registry: &Registry,
    flags: &LoadArgs,
    nproc: usize,
    tp: usize,
    pp: usize,
) -> Result<(LoadedModel, Vec<GptModel>)> {
    if nproc != tp * pp {
        bail!(
            "--nproc {nproc} must equal --tensor-model-parallel-size {tp} x --pipeline-model-parallel-size {pp}: \
             serving and generation run one model replica (no data parallelism)"
        );
    }
    let grid = RankGrid::new(nproc, tp, 1, pp)?;
    let comms = registry
        .communicators("local", json!({ "timeout_secs": TIMEOUT_SECS }), nproc)
        .context("building the `local` communicator for --nproc (is the comm-local feature built?)")?;
    // Every rank gets its own backend thread pool: split the cores instead of oversubscribing.
    let total = flags.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |c| c.get()));
    let flags = LoadArgs { threads: Some((total / nproc).max(1)), ..flags.clone() };
    let loaded: Vec<Result<LoadedModel>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(rank, comm)| {
                let (ctx, flags) = (grid.context(rank, comm.clone()), &flags);
                s.spawn(move || load_model_on(registry, flags, ctx).with_context(|| format!("rank {rank}")))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a loading thread panicked")))).collect()
    });
    let mut ranks = loaded.into_iter().collect::<Result<Vec<_>>>()?.into_iter();
    let first = ranks.next().ok_or_else(|| anyhow!("no ranks loaded"))?;
    Ok((first, ranks.map(|l| l.model).collect()))
}

/// The MPI world of this process (`mpirun -np N megatron serve|generate ...`): one rank per
/// process, N = T x P. Builds the `mpi` communicator (MPI_Init: call it once, on the main
/// thread, which must also hold the returned endpoint to the end so that MPI_Finalize runs there).
pub fn mpi_world(registry: &Registry) -> Result<std::sync::Arc<dyn megatron_core::Communicator>> {
    registry
        .communicators("mpi", json!({ "timeout_secs": TIMEOUT_SECS }), 0)
        .context("building the `mpi` communicator")?
        .into_iter()
        .next()
        .context("the `mpi` communicator returned no endpoint")
}

/// Loads this MPI process's shard: rank r of the world `comm`, on the cores the launcher bound
/// the process to (`--threads` overrides).
pub fn load_mpi_rank(
    registry: &Registry,
    flags: &LoadArgs,
    comm: std::sync::Arc<dyn megatron_core::Communicator>,
    tp: usize,
    pp: usize,
) -> Result<LoadedModel> {
    let n = comm.world_size();
    if n != tp * pp {
        bail!(
            "the MPI world has {n} processes but --tensor-model-parallel-size {tp} x --pipeline-model-parallel-size \
             {pp} = {}: serving and generation run one model replica; launch `mpirun -np {}`",
            tp * pp,
            tp * pp
        );
    }
    let grid = RankGrid::new(n, tp, 1, pp)?;
    let bound = std::thread::available_parallelism().map_or(1, |c| c.get());
    let flags = LoadArgs { threads: Some(flags.threads.unwrap_or(bound)), ..flags.clone() };
    let rank = comm.rank();
    load_model_on(registry, &flags, grid.context(rank, comm)).with_context(|| format!("MPI rank {rank} of {n}"))
}

/// Runs `f` as this MPI rank; an error or a panic prints `rank R of N failed: ...` and aborts
/// the job (MPI_Abort), so no peer waits for this rank until the timeout (and MPI_Finalize,
/// which waits for every process, is never reached with peers still inside a collective).
pub fn run_mpi_rank<T>(comm: &dyn megatron_core::Communicator, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let what = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
        Err(anyhow!("panicked: {}", what.unwrap_or_else(|| "a non-string panic payload".into())))
    });
    if let Err(e) = &r {
        let message = format!("rank {} of {} failed: {e:#}", comm.rank(), comm.world_size());
        eprintln!("error: {message}");
        comm.abort(&message);
    }
    r
}
