//! `megatron-moe`: Mixture of Experts (SPEC §4.12, §4.15.3, §5.8) as a plugin of kind `mlp`
//! named `moe`. The host's transformer layers ask it for their MLP slot; it answers with a
//! [`MoeLayer`] on the layers `moe_layer_freq` selects and leaves the others dense. It depends
//! on megatron-core only, so the same crate is linked in (`--features moe`) or loaded at run
//! time (`megatron --plugin target/release/libmegatron_moe.so pretrain --num-experts 8 ...`).
//!
//! * [`router`]: `TopKRouter` — softmax (pre/post top-k) or sigmoid scores, expert bias,
//!   aux / seq / global load-balancing losses, z-loss, capacity and token dropping.
//! * [`experts`]: the local experts' MLPs (SwiGLU or GeLU) through one grouped GEMM per matmul.
//! * [`dispatch`]: the token dispatchers (`alltoall`, `allgather`) over the expert-parallel group.
//! * [`shared`]: the shared expert (`--moe-shared-expert-intermediate-size`, optional gate).
//! * [`layer`]: [`MoeLayer`], the `MlpModule` tying them together, and its metrics.

pub mod config;
pub mod dispatch;
pub mod experts;
pub mod init;
pub mod layer;
pub mod router;
pub mod shared;

pub use config::MoeConfig;
pub use layer::MoeLayer;

use megatron_core::registry::{parse_config, ConfigDe};
use megatron_core::{Factory, MlpEnv, MlpModule, Plugin, Result};

/// The registered plugin name (`--num-experts` asks for it).
pub const PLUGIN_NAME: &str = "moe";

fn build_mlp(de: ConfigDe, env: &MlpEnv) -> Result<Option<Box<dyn MlpModule>>> {
    let config: MoeConfig = parse_config(de, PLUGIN_NAME)?;
    if !config.is_moe_layer(env.layer_number, env.num_layers)? {
        return Ok(None);
    }
    Ok(Some(Box::new(MoeLayer::new(config, env)?)))
}

fn plugins() -> Vec<Plugin> {
    vec![Plugin {
        name: PLUGIN_NAME,
        description:
            "Mixture of Experts MLP slot: top-k router, grouped-GEMM experts, alltoall/allgather expert parallelism",
        factory: Factory::Mlp(build_mlp),
    }]
}

megatron_core::inventory::submit! {
    megatron_core::PluginCrate { crate_name: env!("CARGO_PKG_NAME"), version: env!("CARGO_PKG_VERSION"), plugins }
}

#[cfg(feature = "dynamic")]
megatron_core::export_plugin!();
