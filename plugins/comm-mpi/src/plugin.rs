//! The `mpi` plugin's registration and config.

use crate::collectives::MpiCommunicator;

use megatron_core::registry::{parse_config, ConfigDe};
use megatron_core::{Communicator, Factory, Plugin, PluginCrate, Result};
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;

/// Config of the `mpi` communicator.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MpiConfig {
    /// How long a rank waits for its peers before failing (`--distributed-timeout-minutes`).
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
}

fn default_timeout_secs() -> u64 {
    600
}

/// `world_size` 0: whatever MPI says; otherwise it must be MPI's world size.
fn mpi_factory(de: ConfigDe, world_size: usize) -> Result<Vec<Arc<dyn Communicator>>> {
    let cfg: MpiConfig = parse_config(de, "mpi")?;
    if cfg.timeout_secs == 0 {
        anyhow::bail!("`mpi` communicator: timeout_secs must be > 0 (--distributed-timeout-minutes)");
    }
    let comm = MpiCommunicator::init(Duration::from_secs(cfg.timeout_secs))?;
    if world_size != 0 && world_size != comm.world_size() {
        anyhow::bail!(
            "the `mpi` communicator was asked for {world_size} ranks but MPI_COMM_WORLD has {}; the world size \
             comes from the launcher (mpirun -np N / srun -n N)",
            comm.world_size()
        );
    }
    if comm.rank() == 0 {
        // Which implementation a run is on (Open MPI and MPICH builds look the same otherwise).
        println!("MPI library: {}", comm.library());
    }
    Ok(vec![Arc::new(comm)])
}

fn plugins() -> Vec<Plugin> {
    vec![Plugin {
        name: "mpi",
        description: "one rank per process over MPI (mpirun/srun): polled non-blocking point-to-point collectives, \
                      rank-order reductions, timeouts naming the missing ranks; config: timeout_secs (default 600)",
        factory: Factory::Communicator(mpi_factory),
    }]
}

megatron_core::inventory::submit! {
    PluginCrate { crate_name: env!("CARGO_PKG_NAME"), version: env!("CARGO_PKG_VERSION"), plugins }
}

#[cfg(test)]
mod tests {
    use crate::world::{group_hash, Header};
    use megatron_core::Group;

    #[test]
    fn header_round_trips_and_hash_is_stable() {
        let h =
            Header { group: 7, seq: 3, kind: 1, op: 2, dtype: 1, len: 4, root: 0, payload_bytes: 0, shape: vec![2, 2] };
        let msg = h.frame(&[1, 2, 3, 4]);
        let (back, payload) = Header::parse(&msg).unwrap();
        assert_eq!(payload, &[1, 2, 3, 4]);
        assert_eq!(back, Header { payload_bytes: 4, ..h });
        // FNV-1a: fixed across processes and builds; distinct for names and for ranks.
        let a = group_hash(&Group::new("tp", vec![0, 1]));
        assert_eq!(a, group_hash(&Group::new("tp", vec![0, 1])));
        assert_ne!(a, group_hash(&Group::new("dp", vec![0, 1])));
        assert_ne!(a, group_hash(&Group::new("tp", vec![0, 2])));
    }
}
