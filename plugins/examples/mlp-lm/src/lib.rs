//! `megatron-example-mlp-lm`: an example megatron-rs plugin crate, and the one
//! docs/plugins.md walks through. It registers the model `swiglu-mlp-lm` — token embedding,
//! `num_layers` pre-RMSNorm SwiGLU MLP residual blocks, a final RMSNorm and an untied output
//! layer with vocab cross entropy — written against the [`megatron_core::Backend`] trait only,
//! so it runs on whatever backend the host hands it.
//!
//! It depends on megatron-core (+ serde, anyhow) alone. Built as an rlib it can be linked into
//! `megatron` (feature `example-mlp-lm`); built as a cdylib it is loaded at run time with
//! `megatron --plugin target/release/libmegatron_example_mlp_lm.so ...`.

pub mod config;
pub mod init;
pub mod model;

pub use config::MlpLmConfig;
pub use model::MlpLm;

use megatron_core::registry::{parse_config, ConfigDe, ModelEnv};
use megatron_core::{Factory, Model, Plugin, Result};

/// The registered model name.
pub const MODEL_NAME: &str = "swiglu-mlp-lm";

fn build_model(de: ConfigDe, env: &ModelEnv) -> Result<Box<dyn Model>> {
    let config: MlpLmConfig = parse_config(de, MODEL_NAME)?;
    Ok(Box::new(MlpLm::new(config, env.backend.clone(), &env.ctx)?))
}

fn plugins() -> Vec<Plugin> {
    vec![Plugin {
        name: MODEL_NAME,
        description: "example plugin: embedding + pre-RMSNorm SwiGLU MLP blocks + untied LM head (no attention)",
        factory: Factory::Model(build_model),
    }]
}

megatron_core::inventory::submit! {
    megatron_core::PluginCrate { crate_name: env!("CARGO_PKG_NAME"), version: env!("CARGO_PKG_VERSION"), plugins }
}

#[cfg(all(feature = "dynamic", not(feature = "forge-tag")))]
megatron_core::export_plugin!();

// A tag that differs from every real one in its megatron-core version: the host must refuse it.
#[cfg(feature = "forge-tag")]
megatron_core::export_plugin!(
    build_tag = megatron_core::plugin_export::BUILD_TAG.replacen(
        concat!("megatron-core=", env!("CARGO_PKG_VERSION")),
        "megatron-core=0.0.0-forged",
        1
    )
);
