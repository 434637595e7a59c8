//! Writing optimizer state in Megatron-LM's legacy layout (the reverse of
//! [`crate::optim_read`]): per rank, torch's Adam state dict numbered in Megatron's order —
//! param groups weight-decayed first, then weight-decay-free (Megatron ≥ 0.14 sorts the default
//! group first), each filled with the rank's parameters in module order — inside Megatron's
//! `Float16OptimizerWithFloat16Params` wrapper (`fp32_from_fp16_params`) when the model is half
//! precision, bare (`FP32Optimizer`) when it is fp32.

use crate::optim_read::{no_weight_decay, FullOptimizerState, EXP_AVG, EXP_AVG_SQ, MAIN_PARAM};
use crate::torchzip::TensorData;
use crate::value::TorchDType;
use crate::writer::Out;
use anyhow::{anyhow, Result};

/// Megatron-Core's module registration order of a GPT rank's parameters (what
/// `named_parameters()` and the state dict list): embeddings, layers (norm, attention output
/// projection before the fused QKV — `Attention` registers `linear_proj` first — MLP), final
/// norm, output layer.
pub fn module_order(local: &str) -> (u8, usize, u8, String) {
    const LAYER: [&str; 12] = [
        "input_layernorm.weight",
        "input_layernorm.bias",
        "self_attention.linear_proj.weight",
        "self_attention.linear_proj.bias",
        "self_attention.linear_qkv.weight",
        "self_attention.linear_qkv.bias",
        "pre_mlp_layernorm.weight",
        "pre_mlp_layernorm.bias",
        "mlp.linear_fc1.weight",
        "mlp.linear_fc1.bias",
        "mlp.linear_fc2.weight",
        "mlp.linear_fc2.bias",
    ];
    match local {
        "embedding.word_embeddings.weight" => (0, 0, 0, String::new()),
        "embedding.position_embeddings.weight" => (0, 0, 1, String::new()),
        "decoder.final_layernorm.weight" => (2, 0, 0, String::new()),
        "decoder.final_layernorm.bias" => (2, 0, 1, String::new()),
        "output_layer.weight" => (3, 0, 0, String::new()),
        n => match n.strip_prefix("decoder.layers.").and_then(|r| r.split_once('.')) {
            Some((i, tail)) => {
                let pos = LAYER.iter().position(|t| *t == tail).unwrap_or(LAYER.len()) as u8;
                (1, i.parse().unwrap_or(usize::MAX), pos, tail.to_string())
            }
            None => (4, 0, 0, n.to_string()),
        },
    }
}

/// Adam hyper-parameters written into each param group (torch's AdamW keys plus Megatron's).
#[derive(Clone, Debug)]
pub struct GroupHyper {
    pub lr: f64,
    pub min_lr: f64,
    pub max_lr: f64,
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
}

impl GroupHyper {
    /// From Megatron's args (`lr`, `min_lr`, `weight_decay`, `adam_beta1/2`, `adam_eps`).
    pub fn from_args(args: &serde_json::Value) -> GroupHyper {
        let f = |k: &str, d: f64| args.get(k).and_then(|v| v.as_f64()).unwrap_or(d);
        let lr = f("lr", 0.0);
        GroupHyper {
            lr,
            max_lr: lr,
            min_lr: f("min_lr", 0.0),
            weight_decay: f("weight_decay", 0.01),
            beta1: f("adam_beta1", 0.9),
            beta2: f("adam_beta2", 0.999),
            eps: f("adam_eps", 1e-8),
        }
    }

    fn group(&self, wd_mult: f64, params: Vec<Out>) -> Out {
        let items: Vec<(&str, Out)> = vec![
            ("lr", Out::Float(self.lr)),
            ("betas", Out::Tuple(vec![Out::Float(self.beta1), Out::Float(self.beta2)])),
            ("eps", Out::Float(self.eps)),
            ("weight_decay", Out::Float(self.weight_decay * wd_mult)),
            ("amsgrad", Out::Bool(false)),
            ("foreach", Out::None),
            ("maximize", Out::Bool(false)),
            ("capturable", Out::Bool(false)),
            ("differentiable", Out::Bool(false)),
            ("fused", Out::None),
            ("decoupled_weight_decay", Out::Bool(true)),
            ("is_expert_parallel", Out::Bool(false)),
            ("default_config", Out::Bool(true)),
            ("wd_mult", Out::Float(wd_mult)),
            ("lr_mult", Out::Float(1.0)),
            ("is_decoupled_lr", Out::Bool(false)),
            ("max_lr", Out::Float(self.max_lr)),
            ("min_lr", Out::Float(self.min_lr)),
            ("params", Out::List(params)),
        ];
        Out::Dict(items.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }
}

/// One parameter of a rank: local name (module order), its tp shard of each optimizer state.
pub struct RankParam {
    pub local: String,
    pub shape: Vec<usize>,
    /// `exp_avg`, `exp_avg_sq` and (half models) `main_param` shards; `None` before step 1.
    pub states: Option<Vec<(String, TensorData)>>,
}

/// The `optimizer` entry of one rank: `params` must be in module order.
pub fn rank_optimizer(params: &[RankParam], full: &FullOptimizerState, half: bool, hyper: &GroupHyper) -> Result<Out> {
    let mut groups = Vec::new();
    let mut state = Vec::new();
    let mut mains = Vec::new();
    let mut index = 0i64;
    for zero_wd in [false, true] {
        let members: Vec<&RankParam> =
            params.iter().filter(|p| no_weight_decay(&p.local, &p.shape) == zero_wd).collect();
        let mut ids = Vec::new();
        let mut group_mains = Vec::new();
        for p in members {
            ids.push(Out::Int(index));
            if let Some(states) = &p.states {
                let get = |n: &str| {
                    states
                        .iter()
                        .find(|(k, _)| k == n)
                        .map(|(_, t)| Out::Tensor(t.clone()))
                        .ok_or_else(|| anyhow!("optimizer state `{}.{n}` is missing", p.local))
                };
                let step = TensorData {
                    dtype: TorchDType::F32,
                    shape: vec![],
                    bytes: (full.step as f32).to_le_bytes().to_vec(),
                };
                state.push((
                    index,
                    Out::Dict(vec![
                        ("step".into(), Out::Tensor(step)),
                        (EXP_AVG.into(), get(EXP_AVG)?),
                        (EXP_AVG_SQ.into(), get(EXP_AVG_SQ)?),
                    ]),
                ));
                if half {
                    group_mains.push(get(MAIN_PARAM)?);
                }
            }
            index += 1;
        }
        groups.push(hyper.group(if zero_wd { 0.0 } else { 1.0 }, ids));
        mains.push(Out::List(group_mains));
    }
    let torch = Out::Dict(vec![("state".into(), Out::IntDict(state)), ("param_groups".into(), Out::List(groups))]);
    if !half {
        return Ok(torch);
    }
    let mut wrapper = vec![("optimizer".to_string(), torch)];
    if let Some(s) = &full.grad_scaler {
        wrapper.push(("grad_scaler".into(), Out::from_json(s)));
    }
    wrapper.push(("fp32_from_fp16_params".into(), Out::List(mains)));
    Ok(Out::Dict(wrapper))
}
