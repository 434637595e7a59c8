//! [`MoeConfig`]: the `moe` plugin's configuration (Megatron's flag names in snake_case, SPEC
//! §4.12 defaults unless said otherwise) and the `--moe-layer-freq` pattern.

use anyhow::{bail, Context, Result};
use serde::Deserialize;

fn two() -> usize {
    2
}
fn one() -> usize {
    1
}
fn softmax() -> String {
    "softmax".into()
}
fn aux_loss() -> String {
    "aux_loss".into()
}
fn probs() -> String {
    "probs".into()
}
fn alltoall() -> String {
    "alltoall".into()
}
fn rate() -> f32 {
    1e-3
}
fn yes() -> bool {
    true
}
fn freq_one() -> LayerFreq {
    LayerFreq::Every(1)
}

/// `--moe-layer-freq`: every N-th layer (from layer 0), or a per-layer 0/1 pattern given as a
/// list (`[1,0,1,1]`) or Megatron's expression string (`"([1]*3+[0]*1)*2"`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum LayerFreq {
    Every(usize),
    List(Vec<u8>),
    Pattern(String),
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeConfig {
    pub num_experts: usize,
    #[serde(default = "freq_one")]
    pub moe_layer_freq: LayerFreq,
    /// Expert FFN width; default the dense `ffn_hidden_size`.
    #[serde(default)]
    pub moe_ffn_hidden_size: Option<usize>,
    #[serde(default = "two")]
    pub moe_router_topk: usize,
    /// `softmax` or `sigmoid`.
    #[serde(default = "softmax")]
    pub moe_router_score_function: String,
    #[serde(default)]
    pub moe_router_pre_softmax: bool,
    #[serde(default)]
    pub moe_router_topk_scaling_factor: Option<f32>,
    /// `aux_loss`, `seq_aux_loss`, `global_aux_loss` or `none`.
    #[serde(default = "aux_loss")]
    pub moe_router_load_balancing_type: String,
    #[serde(default)]
    pub moe_aux_loss_coeff: f32,
    #[serde(default)]
    pub moe_z_loss_coeff: Option<f32>,
    #[serde(default)]
    pub moe_router_enable_expert_bias: bool,
    #[serde(default = "rate")]
    pub moe_router_bias_update_rate: f32,
    /// `None`: dropless.
    #[serde(default)]
    pub moe_expert_capacity_factor: Option<f32>,
    #[serde(default)]
    pub moe_pad_expert_input_to_capacity: bool,
    /// `probs` (keep the highest-probability tokens) or `position` (keep the earliest).
    #[serde(default = "probs")]
    pub moe_token_drop_policy: String,
    /// `alltoall` or `allgather` (they differ only with expert parallelism). Megatron's default
    /// is `allgather`; ours is `alltoall`, the one its docs recommend for EP.
    #[serde(default = "alltoall")]
    pub moe_token_dispatcher_type: String,
    #[serde(default = "one")]
    pub expert_model_parallel_size: usize,
    /// `--expert-tensor-parallel-size`: every expert's fc1 split by output columns and fc2 by
    /// input rows over this many ranks (default 1; Megatron's default is the dense TP size).
    #[serde(default = "one")]
    pub expert_tensor_parallel_size: usize,
    /// One grouped GEMM per matmul over the local experts (`false`: one GEMM call per expert,
    /// the reference the benchmark compares against).
    #[serde(default = "yes")]
    pub moe_grouped_gemm: bool,
    /// Micro-batches per step: the aux/z-loss gradients are scaled by its inverse, like the
    /// LM loss (Megatron's `MoEAuxLossAutoScaler`). Set by the driver.
    #[serde(default = "one")]
    pub num_microbatches: usize,
    /// Group-limited routing: the experts form this many equal groups (`None`: off).
    #[serde(default)]
    pub moe_router_num_groups: Option<usize>,
    /// Groups every token may use under group-limited routing.
    #[serde(default)]
    pub moe_router_group_topk: Option<usize>,
    /// Width of the shared expert every token goes through (`None`: no shared expert).
    #[serde(default)]
    pub moe_shared_expert_intermediate_size: Option<usize>,
    /// Scale the shared expert's output by `σ(x · gate_weightᵀ)` per token.
    #[serde(default)]
    pub moe_shared_expert_gate: bool,
}

impl MoeConfig {
    /// Checks the values that do not depend on the model sizes.
    pub fn validate(&self) -> Result<()> {
        let c = self;
        if c.num_experts == 0 || c.moe_router_topk == 0 || c.moe_router_topk > c.num_experts {
            bail!(
                "--num-experts {} and --moe-router-topk {} must satisfy 1 <= topk <= num_experts",
                c.num_experts,
                c.moe_router_topk
            );
        }
        if !matches!(c.moe_router_score_function.as_str(), "softmax" | "sigmoid") {
            bail!("--moe-router-score-function `{}`: expected `softmax` or `sigmoid`", c.moe_router_score_function);
        }
        if c.moe_router_pre_softmax && c.moe_router_score_function != "softmax" {
            bail!("--moe-router-pre-softmax needs --moe-router-score-function softmax");
        }
        if !matches!(
            c.moe_router_load_balancing_type.as_str(),
            "aux_loss" | "seq_aux_loss" | "global_aux_loss" | "none"
        ) {
            bail!(
                "--moe-router-load-balancing-type `{}` is not implemented: use aux_loss, seq_aux_loss, \
                 global_aux_loss or none (sinkhorn is not in this plugin)",
                c.moe_router_load_balancing_type
            );
        }
        if !matches!(c.moe_token_drop_policy.as_str(), "probs" | "position") {
            bail!("--moe-token-drop-policy `{}`: expected `probs` or `position`", c.moe_token_drop_policy);
        }
        if !matches!(c.moe_token_dispatcher_type.as_str(), "alltoall" | "allgather") {
            bail!(
                "--moe-token-dispatcher-type `{}`: expected `alltoall` or `allgather` (flex needs DeepEP)",
                c.moe_token_dispatcher_type
            );
        }
        if c.expert_model_parallel_size == 0 || !c.num_experts.is_multiple_of(c.expert_model_parallel_size) {
            bail!(
                "--num-experts {} must be divisible by --expert-model-parallel-size {}",
                c.num_experts,
                c.expert_model_parallel_size
            );
        }
        if c.expert_tensor_parallel_size == 0 {
            bail!("--expert-tensor-parallel-size must be >= 1");
        }
        if let Some(cf) = c.moe_expert_capacity_factor {
            if !(cf > 0.0 && cf.is_finite()) {
                bail!("--moe-expert-capacity-factor must be > 0, got {cf}");
            }
        } else if c.moe_pad_expert_input_to_capacity {
            bail!("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor");
        }
        if c.moe_aux_loss_coeff < 0.0 || c.moe_z_loss_coeff.is_some_and(|z| z < 0.0) {
            bail!("--moe-aux-loss-coeff and --moe-z-loss-coeff must be >= 0");
        }
        if c.moe_shared_expert_intermediate_size == Some(0) {
            bail!("--moe-shared-expert-intermediate-size must be >= 1");
        }
        if c.moe_shared_expert_gate && c.moe_shared_expert_intermediate_size.is_none() {
            bail!("--moe-shared-expert-gate needs --moe-shared-expert-intermediate-size");
        }
        match (c.moe_router_num_groups, c.moe_router_group_topk) {
            (None, None) => {}
            (Some(groups), Some(g)) => {
                if groups == 0 || !c.num_experts.is_multiple_of(groups) {
                    bail!("--moe-router-num-groups {groups} must be >= 1 and divide --num-experts {}", c.num_experts);
                }
                if g == 0 || g > groups || !c.moe_router_topk.is_multiple_of(g) {
                    bail!(
                        "--moe-router-group-topk {g} must be in 1..=--moe-router-num-groups {groups} and divide \
                         --moe-router-topk {}",
                        c.moe_router_topk
                    );
                }
                if c.moe_router_topk / g > c.num_experts / groups {
                    bail!(
                        "--moe-router-topk {} / --moe-router-group-topk {g} experts per group exceeds the group size \
                         {} (--num-experts / --moe-router-num-groups)",
                        c.moe_router_topk,
                        c.num_experts / groups
                    );
                }
            }
            _ => bail!("group-limited routing needs both --moe-router-num-groups and --moe-router-group-topk"),
        }
        if c.num_microbatches == 0 {
            bail!("num_microbatches must be >= 1");
        }
        Ok(())
    }

    /// Whether layer `layer` (0-based) of `num_layers` is an MoE layer.
    pub fn is_moe_layer(&self, layer: usize, num_layers: usize) -> Result<bool> {
        let pattern = match &self.moe_layer_freq {
            LayerFreq::Every(0) => bail!("--moe-layer-freq must be >= 1"),
            LayerFreq::Every(n) => return Ok(layer.is_multiple_of(*n)),
            LayerFreq::List(v) => v.clone(),
            LayerFreq::Pattern(s) => parse_pattern(s)
                .with_context(|| format!("--moe-layer-freq `{s}` (expected e.g. \"([1]*3+[0]*1)*2\")"))?,
        };
        if pattern.len() != num_layers || pattern.iter().any(|&b| b > 1) {
            bail!("--moe-layer-freq pattern {pattern:?} must have one 0/1 entry per layer ({num_layers} layers)");
        }
        Ok(pattern[layer] == 1)
    }
}

/// Parses `expr := term ('+' term)*`, `term := atom ('*' int)*`, `atom := '[' ints ']' | '(' expr ')'`.
pub fn parse_pattern(s: &str) -> Result<Vec<u8>> {
    let chars: Vec<char> = s.chars().filter(|c| !c.is_whitespace()).collect();
    let mut pos = 0;
    let v = expr(&chars, &mut pos)?;
    if pos != chars.len() {
        bail!("unexpected `{}` at position {pos}", chars[pos]);
    }
    Ok(v)
}

fn expr(c: &[char], pos: &mut usize) -> Result<Vec<u8>> {
    let mut v = term(c, pos)?;
    while c.get(*pos) == Some(&'+') {
        *pos += 1;
        v.extend(term(c, pos)?);
    }
    Ok(v)
}

fn term(c: &[char], pos: &mut usize) -> Result<Vec<u8>> {
    let mut v = atom(c, pos)?;
    while c.get(*pos) == Some(&'*') {
        *pos += 1;
        let n = int(c, pos)?;
        v = v.repeat(n);
    }
    Ok(v)
}

fn atom(c: &[char], pos: &mut usize) -> Result<Vec<u8>> {
    match c.get(*pos) {
        Some('(') => {
            *pos += 1;
            let v = expr(c, pos)?;
            if c.get(*pos) != Some(&')') {
                bail!("missing `)` at position {pos}");
            }
            *pos += 1;
            Ok(v)
        }
        Some('[') => {
            *pos += 1;
            let mut v = Vec::new();
            while c.get(*pos) != Some(&']') {
                v.push(u8::try_from(int(c, pos)?)?);
                if c.get(*pos) == Some(&',') {
                    *pos += 1;
                }
            }
            *pos += 1;
            Ok(v)
        }
        other => bail!("expected `(` or `[` at position {pos}, found {other:?}"),
    }
}

fn int(c: &[char], pos: &mut usize) -> Result<usize> {
    let start = *pos;
    while c.get(*pos).is_some_and(char::is_ascii_digit) {
        *pos += 1;
    }
    if start == *pos {
        bail!("expected a number at position {start}");
    }
    Ok(c[start..*pos].iter().collect::<String>().parse()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_parse_like_python() {
        assert_eq!(parse_pattern("([1]*3+[0]*1)*2").unwrap(), vec![1, 1, 1, 0, 1, 1, 1, 0]);
        assert_eq!(parse_pattern("[0,1]*2+[1]").unwrap(), vec![0, 1, 0, 1, 1]);
        assert!(parse_pattern("[1]*").is_err());
        assert!(parse_pattern("(1)").is_err());
    }
}
