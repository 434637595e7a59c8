//! `megatron-t5`: the T5 encoder-decoder model (Megatron-Core `T5Model`, SPEC §4.9) built from
//! `megatron-transformer` pieces and the backend's cross-attention op, and the `t5` model
//! plugin registration.
//!
//! Megatron's T5 by default: learned absolute positions shared by encoder and decoder,
//! pre-LayerNorm, GeLU, biases, the LM head tied to the word embedding with a bias. Options
//! make Hugging Face's T5 representable: relative position buckets
//! ([`relative::relative_position_bucket`]), RMSNorm without bias (`T5LayerNorm`), no linear
//! biases, ReLU or gated-GeLU feed-forward, unscaled attention and the tied head's
//! `h^-0.5` scaling. Batches use the packed layout of [`batch`].

pub mod attention;
pub mod batch;
pub mod config;
pub mod decode;
pub mod generate;
pub mod hf;
pub mod host;
pub mod layer;
pub mod mlp;
pub mod model;
pub mod recompute;
pub mod relative;

pub use batch::{pack_sample, T5Batch};
pub use config::{T5Activation, T5Config};
pub use model::T5Model;

use megatron_core::registry::{parse_config, ConfigDe, ModelEnv};
use megatron_core::{Factory, Model, Plugin, Result};

fn build_t5(de: ConfigDe, env: &ModelEnv) -> Result<Box<dyn Model>> {
    let config: T5Config = parse_config(de, "t5")?;
    Ok(Box::new(T5Model::new(config, env.backend.clone(), env.ctx.clone())?))
}

fn plugins() -> Vec<Plugin> {
    vec![Plugin {
        name: "t5",
        description: "T5 encoder-decoder (shared embedding, cross-attention, tied LM head with bias; learned or relative positions)",
        factory: Factory::Model(build_t5),
    }]
}

megatron_core::inventory::submit! {
    megatron_core::PluginCrate { crate_name: env!("CARGO_PKG_NAME"), version: env!("CARGO_PKG_VERSION"), plugins }
}
