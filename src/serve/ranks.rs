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
