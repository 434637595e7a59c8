//! `megatron-parallel`: the `megatron` parallel strategy (Megatron's rank grid, SPEC §5.1, and
//! data-parallel gradient averaging, §5.6), the `single` communicator of a one-rank world and
//! the `no-pipelining` schedule (gradient accumulation over microbatches, §5.5, §6.8).

mod bubble;
mod buckets;
mod ddp;
mod interleaved;
mod interleaved_schedule;
mod no_pipelining;
mod one_f_one_b;
mod single_comm;
mod strategy;

pub use bubble::simulated_bubble;
pub use buckets::{default_bucket_size, layout_buckets, layout_buckets_separate, Bucket};
pub use ddp::{DdpOptions, DdpReducer, ShardBucket};
pub use interleaved::{
    bubble_fraction, check_interleaving, interleaved_order, interleaved_warmup, virtual_microbatch_table, ChunkAction,
};
pub use interleaved_schedule::{InterleavedConfig, InterleavedOneFOneB};
pub use no_pipelining::NoPipelining;
pub use one_f_one_b::{one_f_one_b_order, OneFOneB, PipelineAction};
pub use single_comm::single_communicators;
pub use strategy::{dp_cp_group, MegatronStrategy, StrategyConfig};

use megatron_core::registry::{parse_config, ConfigDe};
use megatron_core::{Communicator, Factory, ParallelStrategy, Plugin, PluginCrate, Result, Schedule};
use serde::Deserialize;
use std::sync::Arc;

/// The `single` communicator and the `no-pipelining` schedule take no options.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NoOptions {}

fn strategy_factory(de: ConfigDe) -> Result<Box<dyn ParallelStrategy>> {
    Ok(Box::new(MegatronStrategy::new(parse_config(de, "megatron")?)?))
}

fn single_factory(de: ConfigDe, world_size: usize) -> Result<Vec<Arc<dyn Communicator>>> {
    let NoOptions {} = parse_config(de, "single")?;
    single_communicators(world_size)
}

fn no_pipelining_factory(de: ConfigDe) -> Result<Box<dyn Schedule>> {
    let NoOptions {} = parse_config(de, "no-pipelining")?;
    Ok(Box::new(NoPipelining))
}

fn plugins() -> Vec<Plugin> {
    vec![
        Plugin {
            name: "megatron",
            description: "Megatron's tp-cp-dp-pp rank grid and DP gradient averaging (1/dp pre-scale + SUM, DDP \
                          buckets); config: tensor_model_parallel_size, pipeline_model_parallel_size, \
                          context_parallel_size, ddp_bucket_size, overlap_grad_reduce",
            factory: Factory::ParallelStrategy(strategy_factory),
        },
        Plugin {
            name: "single",
            description: "the communicator of a one-rank world (every collective is the identity)",
            factory: Factory::Communicator(single_factory),
        },
        Plugin {
            name: "no-pipelining",
            description: "forward and backward of each microbatch in turn (gradient accumulation; pp = 1)",
            factory: Factory::Schedule(no_pipelining_factory),
        },
        one_f_one_b::plugin(),
        interleaved_schedule::plugin(),
    ]
}

megatron_core::inventory::submit! {
    PluginCrate { crate_name: env!("CARGO_PKG_NAME"), version: env!("CARGO_PKG_VERSION"), plugins }
}

#[cfg(test)]
mod tests {
    use megatron_core::{PluginKind, Registry};
    use serde_json::json;

    #[test]
    fn plugins_are_registered_and_reject_unknown_fields() {
        let reg = Registry::builtin().unwrap();
        assert!(reg.names(PluginKind::ParallelStrategy).contains(&"megatron"));
        assert_eq!(reg.schedule("no-pipelining", json!({})).unwrap().name(), "no-pipelining");
        assert_eq!(reg.communicators("single", json!({}), 1).unwrap().len(), 1);
        let err = reg.communicators("single", json!({}), 2).err().unwrap().to_string();
        assert!(err.contains("`local`") && err.contains("Tensor, pipeline and data parallelism"), "{err}");
        let err = reg.schedule("no-pipelining", json!({"chunks": 2})).err().unwrap().to_string();
        assert!(err.contains("chunks") && err.contains("no-pipelining"), "{err}");
        let err = reg.strategy("megatron", json!({"tensor_parallel": 2})).err().unwrap().to_string();
        assert!(err.contains("tensor_parallel") && err.contains("tensor_model_parallel_size"), "{err}");
        let s = reg.strategy("megatron", json!({})).unwrap();
        assert_eq!(s.name(), "megatron");
    }
}
