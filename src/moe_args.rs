//! The Mixture-of-Experts flags of `megatron pretrain` (SPEC §4.12). The driver only forwards
//! them: `--num-experts` asks the plugin registry for the `mlp` plugin `moe` (feature `moe`, or
//! `--plugin libmegatron_moe.so`), which fills the MLP slots of the model's layers.

use clap::Args;
use serde::Serialize;
use serde_json::{json, Value};

#[derive(Args, Clone, Debug, Default, Serialize)]
pub struct MoeArgs {
    /// Experts per MoE layer; turns the `moe` MLP plugin on.
    #[arg(long)]
    pub num_experts: Option<usize>,
    /// Every N-th layer is MoE, or a pattern such as "([1]*3+[0]*1)*2".
    #[arg(long)]
    pub moe_layer_freq: Option<String>,
    #[arg(long)]
    pub moe_ffn_hidden_size: Option<usize>,
    #[arg(long, default_value_t = 2)]
    pub moe_router_topk: usize,
    #[arg(long, default_value = "softmax")]
    pub moe_router_score_function: String,
    #[arg(long)]
    pub moe_router_pre_softmax: bool,
    #[arg(long)]
    pub moe_router_topk_scaling_factor: Option<f32>,
    #[arg(long, default_value = "aux_loss")]
    pub moe_router_load_balancing_type: String,
    #[arg(long, default_value_t = 0.0)]
    pub moe_aux_loss_coeff: f32,
    #[arg(long)]
    pub moe_z_loss_coeff: Option<f32>,
    #[arg(long)]
    pub moe_router_enable_expert_bias: bool,
    #[arg(long, default_value_t = 1e-3)]
    pub moe_router_bias_update_rate: f32,
    #[arg(long)]
    pub moe_expert_capacity_factor: Option<f32>,
    #[arg(long)]
    pub moe_pad_expert_input_to_capacity: bool,
    #[arg(long, default_value = "probs")]
    pub moe_token_drop_policy: String,
    #[arg(long, default_value = "alltoall")]
    pub moe_token_dispatcher_type: String,
    #[arg(long, default_value_t = 1)]
    pub expert_model_parallel_size: usize,
    /// Split every expert over this many ranks of the expert grid (fc1 by columns, fc2 by
    /// rows). Default 1 — Megatron's default is --tensor-model-parallel-size.
    #[arg(long, default_value_t = 1)]
    pub expert_tensor_parallel_size: usize,
    /// Accepted for Megatron compatibility: the plugin always uses its grouped GEMM.
    #[arg(long)]
    pub moe_grouped_gemm: bool,
    /// Group-limited routing: split the experts into this many equal groups (with the EP size:
    /// device-limited routing).
    #[arg(long)]
    pub moe_router_num_groups: Option<usize>,
    /// Under group-limited routing, the number of groups each token may use.
    #[arg(long)]
    pub moe_router_group_topk: Option<usize>,
    /// Width of the shared expert (a dense MLP every token goes through).
    #[arg(long)]
    pub moe_shared_expert_intermediate_size: Option<usize>,
    /// Gate the shared expert's output per token with a sigmoid.
    #[arg(long)]
    pub moe_shared_expert_gate: bool,
}

impl MoeArgs {
    /// The `moe` plugin's config, or `None` without `--num-experts`.
    pub fn plugin_config(&self, num_microbatches: usize) -> Option<Value> {
        let e = self.num_experts?;
        let freq = match self.moe_layer_freq.as_deref().map(str::trim) {
            None => json!(1),
            Some(s) => s.parse::<usize>().map(|n| json!(n)).unwrap_or_else(|_| json!(s.trim_matches('"'))),
        };
        Some(json!({
            "num_experts": e,
            "moe_layer_freq": freq,
            "moe_ffn_hidden_size": self.moe_ffn_hidden_size,
            "moe_router_topk": self.moe_router_topk,
            "moe_router_score_function": self.moe_router_score_function,
            "moe_router_pre_softmax": self.moe_router_pre_softmax,
            "moe_router_topk_scaling_factor": self.moe_router_topk_scaling_factor,
            "moe_router_load_balancing_type": self.moe_router_load_balancing_type,
            "moe_aux_loss_coeff": self.moe_aux_loss_coeff,
            "moe_z_loss_coeff": self.moe_z_loss_coeff,
            "moe_router_enable_expert_bias": self.moe_router_enable_expert_bias,
            "moe_router_bias_update_rate": self.moe_router_bias_update_rate,
            "moe_expert_capacity_factor": self.moe_expert_capacity_factor,
            "moe_pad_expert_input_to_capacity": self.moe_pad_expert_input_to_capacity,
            "moe_token_drop_policy": self.moe_token_drop_policy,
            "moe_token_dispatcher_type": self.moe_token_dispatcher_type,
            "expert_model_parallel_size": self.expert_model_parallel_size,
            "expert_tensor_parallel_size": self.expert_tensor_parallel_size,
            "num_microbatches": num_microbatches,
            "moe_router_num_groups": self.moe_router_num_groups,
            "moe_router_group_topk": self.moe_router_group_topk,
            "moe_shared_expert_intermediate_size": self.moe_shared_expert_intermediate_size,
            "moe_shared_expert_gate": self.moe_shared_expert_gate,
        }))
    }
}

/// The `moe` plugin's config for running (generation, export) a checkpoint whose stored args
/// have `num_experts`: every plugin key the args hold (a `pretrain` checkpoint holds all of
/// them; an imported Mixtral only the sizes, the rest keep the plugin's defaults), on one
/// rank (ep = etp = 1, one micro-batch). `None` for a dense checkpoint.
pub fn plugin_config_from_stored_args(args: &Value) -> Option<Value> {
    let e = args["num_experts"].as_u64()?;
    let keys = MoeArgs { num_experts: Some(e as usize), ..Default::default() }.plugin_config(1)?;
    let mut config = serde_json::Map::new();
    for key in keys.as_object()?.keys() {
        match args.get(key) {
            Some(v) if !v.is_null() => config.insert(key.clone(), v.clone()),
            _ => None,
        };
    }
    if let Some(freq) = args["moe_layer_freq"].as_str() {
        let moe = MoeArgs { num_experts: Some(e as usize), moe_layer_freq: Some(freq.into()), ..Default::default() };
        config.insert("moe_layer_freq".into(), moe.plugin_config(1)?["moe_layer_freq"].clone());
    }
    config.insert("expert_model_parallel_size".into(), json!(1));
    config.insert("expert_tensor_parallel_size".into(), json!(1));
    config.insert("num_microbatches".into(), json!(1));
    Some(Value::Object(config))
}
