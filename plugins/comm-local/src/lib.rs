//! `megatron-comm-local`: the `local` communicator plugin. Every rank is a thread of one
//! process; collectives meet in shared buffers guarded by one mutex and condition variable.
//!
//! Properties the rest of megatron-rs relies on:
//! * reductions add in rank order, so every rank gets the same bits whatever the arrival
//!   order (and a run is reproducible);
//! * every group (by name and ranks) has its own per-rank sequence numbers, so different
//!   threads of one rank may run collectives on different groups at the same time (the
//!   overlapped data-parallel reduce runs beside the tensor-parallel collectives);
//! * nothing hangs: a rank waiting longer than the timeout fails with an error naming the
//!   group, the collective, its sequence number and the ranks that never arrived, and every
//!   other waiting rank reports the same; mismatched collectives are an error naming both.

mod communicator;
pub mod payload;
mod world;

pub use communicator::LocalCommunicator;

use megatron_core::registry::{parse_config, ConfigDe};
use megatron_core::{Communicator, Factory, Plugin, PluginCrate, Result};
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;

/// Config of the `local` communicator.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LocalConfig {
    /// How long a rank waits for its peers before failing (Megatron's
    /// `--distributed-timeout-minutes` 10 = 600 s).
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
}

fn default_timeout_secs() -> u64 {
    600
}

impl Default for LocalConfig {
    fn default() -> LocalConfig {
        LocalConfig { timeout_secs: default_timeout_secs() }
    }
}

fn local_factory(de: ConfigDe, world_size: usize) -> Result<Vec<Arc<dyn Communicator>>> {
    let cfg: LocalConfig = parse_config(de, "local")?;
    if world_size == 0 {
        anyhow::bail!("the `local` communicator needs a world of at least one rank (--nproc >= 1)");
    }
    if cfg.timeout_secs == 0 {
        anyhow::bail!("`local` communicator: timeout_secs must be > 0 (--distributed-timeout-minutes)");
    }
    Ok(LocalCommunicator::world(world_size, Duration::from_secs(cfg.timeout_secs)))
}

fn plugins() -> Vec<Plugin> {
    vec![Plugin {
        name: "local",
        description: "ranks are threads of one process (shared buffers, rank-order reductions, timeouts naming \
                      the missing ranks); config: timeout_secs (default 600)",
        factory: Factory::Communicator(local_factory),
    }]
}

megatron_core::inventory::submit! {
    PluginCrate { crate_name: env!("CARGO_PKG_NAME"), version: env!("CARGO_PKG_VERSION"), plugins }
}

#[cfg(test)]
mod tests {
    use megatron_core::Registry;
    use serde_json::json;

    #[test]
    fn registered_with_its_config() {
        let reg = Registry::builtin().unwrap();
        let comms = reg.communicators("local", json!({}), 3).unwrap();
        assert_eq!(comms.len(), 3);
        for (r, c) in comms.iter().enumerate() {
            assert_eq!((c.rank(), c.world_size(), c.name()), (r, 3, "local"));
        }
        assert_eq!(reg.communicators("local", json!({ "timeout_secs": 5 }), 1).unwrap().len(), 1);
        let err = reg.communicators("local", json!({ "timeout": 5 }), 2).err().unwrap().to_string();
        assert!(err.contains("timeout") && err.contains("timeout_secs") && err.contains("local"), "{err}");
        let err = reg.communicators("local", json!({ "timeout_secs": 0 }), 2).err().unwrap().to_string();
        assert!(err.contains("timeout_secs must be > 0"), "{err}");
        assert!(reg.communicators("local", json!({}), 0).is_err());
    }
}
