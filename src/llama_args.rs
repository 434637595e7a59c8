//! Llama-family `megatron pretrain` flags added after the first Llama work (Megatron's names):
//! rotary frequency scaling and `--qk-layernorm`, and how they enter the `gpt` model config
//! and come back from a checkpoint's stored args (`megatron generate`).

use clap::Args;
use megatron_core::RopeScaling;
use serde::Serialize;
use serde_json::{json, Value};

#[derive(Args, Clone, Debug, Default, Serialize)]
pub struct LlamaArgs {
    /// Llama-3.1 rotary frequency scaling (low 1, high 4, original context 8192) with
    /// `--rope-scaling-factor`; needs `--position-embedding-type rope`.
    #[arg(long)]
    pub use_rope_scaling: bool,
    /// Factor of `--use-rope-scaling` (Megatron's default 8).
    #[arg(long, default_value_t = 8.0)]
    pub rope_scaling_factor: f32,
    /// Linear rotary position interpolation: positions divided by this factor.
    #[arg(long)]
    pub rotary_seq_len_interpolation_factor: Option<f32>,
    /// RMSNorm/LayerNorm (as `--normalization`) of every head's query and key (OLMo-2, Qwen3).
    #[arg(long)]
    pub qk_layernorm: bool,
}

impl LlamaArgs {
    /// The scaling the flags ask for; both at once is an error.
    pub fn rope_scaling(&self) -> anyhow::Result<RopeScaling> {
        match (self.use_rope_scaling, self.rotary_seq_len_interpolation_factor) {
            (true, Some(_)) => {
                anyhow::bail!("--use-rope-scaling and --rotary-seq-len-interpolation-factor exclude each other")
            }
            (true, None) => Ok(RopeScaling::megatron_llama3(self.rope_scaling_factor)),
            (false, Some(f)) => Ok(RopeScaling::Linear { factor: f }),
            (false, None) => Ok(RopeScaling::None),
        }
    }

    /// Adds the set options to a `gpt` model config (other model plugins reject unknown fields,
    /// so nothing is added when nothing is set). Conflicting flags were refused by
    /// `TrainConfig::from_args` already.
    pub fn insert_into(&self, config: &mut serde_json::Map<String, Value>) {
        if let Ok(scaling) = self.rope_scaling() {
            if !scaling.is_none() {
                if let Ok(v) = serde_json::to_value(scaling) {
                    config.insert("rope_scaling".into(), v);
                }
            }
        }
        if self.qk_layernorm {
            config.insert("qk_layernorm".into(), json!(true));
        }
    }
}

/// The rope scaling recorded in a checkpoint's stored args: an imported checkpoint's
/// `rope_scaling` object (any Llama-3 constants), else the pretrain flags.
pub fn rope_scaling_from_stored_args(args: &Value) -> anyhow::Result<RopeScaling> {
    if !args["rope_scaling"].is_null() {
        return serde_json::from_value(args["rope_scaling"].clone())
            .map_err(|e| anyhow::anyhow!("stored args: bad `rope_scaling` {}: {e}", args["rope_scaling"]));
    }
    let flags = LlamaArgs {
        use_rope_scaling: args["use_rope_scaling"].as_bool().unwrap_or(false),
        rope_scaling_factor: args["rope_scaling_factor"].as_f64().unwrap_or(8.0) as f32,
        rotary_seq_len_interpolation_factor: args["rotary_seq_len_interpolation_factor"].as_f64().map(|f| f as f32),
        qk_layernorm: false,
    };
    flags.rope_scaling()
}
