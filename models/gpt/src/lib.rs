//! `megatron-gpt`: the GPT model (GPT-2/GPT-3 style, Megatron-Core `GPTModel` with the local
//! spec) built from `megatron-transformer` blocks, its config, the Hugging Face GPT-2 weight
//! mapping, and the `gpt` model plugin registration.
//!
//! GPT-2 style by default: learned absolute positions, pre-LayerNorm, GeLU (tanh), biases,
//! embedding dropout, and the output layer tied to the word embedding. Llama style with
//! options: rotary positions, grouped-query attention, RMSNorm, SwiGLU, no biases (or only a
//! qkv bias), untied output layer, q/k layernorms, rescaled rotary frequencies (`hf_llama` maps HF
//! Llama/Mistral/Qwen2/Qwen3 weights, `hf_rope` their rotary settings).

mod activation_stash;
pub mod config;
mod context_parallel;
pub mod hf_gpt2;
pub mod hf_llama;
pub mod hf_rope;
pub mod inference;
mod logits_rows;
pub mod model;
pub mod param_shapes;
// Moved to megatron-transformer (BERT shares it); the path `megatron_gpt::pipeline_split` stays.
pub use megatron_transformer::pipeline_split;
pub mod slots;
mod stage;

pub use config::GptConfig;
pub use hf_gpt2::{export_hf_gpt2, load_hf_gpt2, load_hf_gpt2_file, Export, HfTensor};
pub use hf_llama::{export_hf_llama, load_hf_llama};
pub use inference::KvCache;
pub use model::GptModel;
pub use param_shapes::{gpt_param_count, gpt_param_shapes};
pub use pipeline_split::{pipeline_split, stage_layers, stage_range};
pub use slots::{SlotCall, SlotKvCache};

use megatron_core::registry::{parse_config, ConfigDe, ModelEnv};
use megatron_core::{Factory, Model, Plugin, Result};

fn build_gpt(de: ConfigDe, env: &ModelEnv) -> Result<Box<dyn Model>> {
    let config: GptConfig = parse_config(de, "gpt")?;
    let (backend, ctx) = (env.backend.clone(), env.ctx.clone());
    Ok(Box::new(match &env.mlp {
        // An `mlp` plugin (MoE) fills the MLP slots it wants; everything else stays local.
        Some(mlp) => GptModel::with_provider(
            config,
            backend,
            ctx,
            &megatron_transformer::WithMlpProvider { inner: &megatron_transformer::LocalSpecProvider, mlp },
        )?,
        None => GptModel::new(config, backend, ctx)?,
    }))
}

fn plugins() -> Vec<Plugin> {
    vec![Plugin {
        name: "gpt",
        description: "GPT decoder (learned positions, pre-norm, GeLU/SwiGLU, tied or untied output layer)",
        factory: Factory::Model(build_gpt),
    }]
}

megatron_core::inventory::submit! {
    megatron_core::PluginCrate { crate_name: env!("CARGO_PKG_NAME"), version: env!("CARGO_PKG_VERSION"), plugins }
}
