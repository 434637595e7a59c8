//! `megatron generate --nproc N --tensor-model-parallel-size T --pipeline-model-parallel-size
//! P`: the checkpoint loaded once per rank (ranks as threads, like `megatron serve --nproc`),
//! the [`super::Generator`] on rank 0's shard, and every other rank following its model calls
//! ([`megatron_serving::ranks::follow`]) until it is done.

use super::LoadedModel;
use anyhow::{anyhow, Result};
use megatron_gpt::GptModel;
use megatron_serving::ranks::{follow, Driver};

/// Runs `f` on rank 0's `loaded` model while `followers` (the other ranks' shards) follow it,
/// then stops them. `f`'s error comes first; else a follower's.
pub fn with_followers<T>(
    loaded: &mut LoadedModel,
    followers: Vec<GptModel>,
    f: impl FnOnce(&mut LoadedModel) -> Result<T>,
) -> Result<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = followers
            .into_iter()
            .map(|mut m| {
                let rank = m.parallel_context().rank;
                s.spawn(move || follow(&mut m).map_err(|e| e.context(format!("generation rank {rank}"))))
            })
            .collect();
        let result = f(loaded);
        let model = &loaded.model;
        // A follower waits for the next plan: tell it to stop (after a failed collective the
        // world is aborted and this send fails, which the followers have already seen).
        if let Ok(Some(mut d)) = Driver::for_model(model) {
            d.stop(model);
        }
        let mut follower_error = None;
        for h in handles {
            let r = h.join().unwrap_or_else(|_| Err(anyhow!("a generation rank panicked")));
            if let Err(e) = r {
                follower_error.get_or_insert(e);
            }
        }
        match (result, follower_error) {
            (Err(e), _) => Err(e),
            (Ok(_), Some(e)) => Err(e),
            (Ok(v), None) => Ok(v),
        }
    })
}
