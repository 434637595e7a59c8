//! `megatron-hybrid`: Mamba-2 and hybrid models (Megatron-Core `HybridModel`, formerly
//! `MambaModel`; SPEC §4.11 and §4.15.1), registered as the `hybrid` model plugin (any layer
//! pattern of `M` Mamba-2, `*` attention, `-` MLP) and `mamba` (an all-`M` pattern).
//!
//! [`ops`] holds the mixer's numeric kernels (causal conv1d + SiLU, the SSD chunked scan,
//! gated RMSNorm, Δ/A) with explicit backward and naive references; [`mixer`] the Mamba-2
//! mixer; [`layers`] the residual layers of a pattern; [`model`] the model. The ops run on
//! host f32 (the CPU backend); moving them behind `Backend` ops for other backends is left.

pub mod config;
pub mod decode;
pub mod hf;
pub mod layers;
pub mod mixer;
pub mod model;
pub mod ops;
mod stage;

pub use config::{parse_pattern, HybridConfig, LayerKind};
pub use model::HybridModel;

use megatron_core::registry::{parse_config, ConfigDe, ModelEnv};
use megatron_core::{Factory, Model, Plugin, Result};

fn build_hybrid(de: ConfigDe, env: &ModelEnv) -> Result<Box<dyn Model>> {
    let config: HybridConfig = parse_config(de, "hybrid")?;
    // `E` layers take their module from the `mlp` plugin (MoE), as the GPT model's MLP slots do.
    Ok(Box::new(HybridModel::with_mlp(config, "hybrid", env.backend.clone(), env.ctx.clone(), env.mlp.as_ref())?))
}

fn build_mamba(de: ConfigDe, env: &ModelEnv) -> Result<Box<dyn Model>> {
    let config: HybridConfig = parse_config(de, "mamba")?;
    if config.layers()?.iter().any(|k| *k != LayerKind::Mamba) {
        anyhow::bail!(
            "--model mamba takes an all-`M` --hybrid-layer-pattern (got `{}`); use --model hybrid for attention/MLP layers",
            config.hybrid_layer_pattern
        );
    }
    Ok(Box::new(HybridModel::new(config, "mamba", env.backend.clone(), env.ctx.clone())?))
}

fn plugins() -> Vec<Plugin> {
    vec![
        Plugin {
            name: "hybrid",
            description: "Hybrid Mamba-2/attention/MLP decoder from --hybrid-layer-pattern (Megatron HybridModel)",
            factory: Factory::Model(build_hybrid),
        },
        Plugin {
            name: "mamba",
            description: "Mamba-2 decoder (an all-M hybrid pattern)",
            factory: Factory::Model(build_mamba),
        },
    ]
}

megatron_core::inventory::submit! {
    megatron_core::PluginCrate { crate_name: env!("CARGO_PKG_NAME"), version: env!("CARGO_PKG_VERSION"), plugins }
}
