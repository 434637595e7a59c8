//! Activation and workspace bytes, buffer by buffer, from what our modules really allocate
//! (each term below names the field that holds it; checked against heaptrack's peak of
//! `megatron pretrain`, see docs/plan.md). Every buffer is allocated by the first forward or
//! backward of a `(B, T)` shape and **kept** for the rest of the run (`ensure_buffer` in
//! models/transformer), so these bytes are resident at every later phase of a step.
//!
//! Per transformer layer and token (`C` hidden, `q = heads·kv_channels`, `F` ffn; `/tp`
//! where tensor-parallel), one microbatch's set (models/transformer/src/layer.rs,
//! attention.rs, mlp.rs, norm.rs):
//! * activation dtype: `ln1_out`, `ln2_out` (`2C`), `qkv` in the per-head layout (`3q/tp`,
//!   plus `qkv_grouped` `(q + 2kv)/tp` with GQA), `context` (`q/tp`), `fc1_out`
//!   (`gates·F/tp`), `act_out` (`F/tp`);
//! * residual dtype: `h1` and the layer output in the block's `residuals` (`2C`);
//! * fp32: the attention `lse` (`heads/tp`) and the two norms' statistics (`mean` + `rstd`
//!   for LayerNorm, `rstd` for RMSNorm).
//!
//! Per set and stage: the block input `residuals[0]` and `output` (`2C`); on the last stage
//! the `logits` `(B, T, V/tp)` in the activation dtype (its backward runs in place) and the
//! cross-entropy statistics (3 fp32 per token). A pipeline stage keeps one such set per
//! in-flight microbatch (models/gpt/src/activation_stash.rs); dropout masks are regenerated
//! from seeds and attention never stores `T x T` scores.

use crate::{PlanInput, Precision, Recompute};

/// Bytes of one element of the activation dtype (the parameter dtype).
pub fn act_bytes(input: &PlanInput) -> u128 {
    match input.precision {
        Precision::Fp32 => 4,
        Precision::Half => 2,
    }
}

/// Bytes of one element of the residual stream (`--fp32-residual-connection` keeps it fp32).
pub fn residual_bytes(input: &PlanInput) -> u128 {
    if input.fp32_residual {
        4
    } else {
        act_bytes(input)
    }
}

fn tokens(input: &PlanInput) -> u128 {
    (input.micro_batch * input.seq) as u128
}

fn widths(input: &PlanInput) -> (u128, u128, u128, u128, u128) {
    let tp = input.tp as u128;
    let q = (input.heads * input.kv_channels) as u128 / tp;
    let grouped = (input.heads + 2 * input.query_groups) as u128 * input.kv_channels as u128 / tp;
    let gates: u128 = if input.swiglu { 2 } else { 1 };
    (input.hidden as u128, q, grouped, gates, input.ffn as u128 / tp)
}

/// Bytes one layer keeps per microbatch without recomputation (see the module doc).
pub fn activation_bytes_per_microbatch_layer(input: &PlanInput) -> u128 {
    let (c, q, grouped, gates, f) = widths(input);
    let gqa = input.query_groups != input.heads;
    // ln1_out, ln2_out, qkv (per-head), qkv_grouped (GQA only), context, fc1_out, act_out.
    let act = 2 * c + 3 * q + if gqa { grouped } else { 0 } + q + gates * f + f;
    // h1 and the layer output (the next residuals[] entry).
    let residual = 2 * c;
    // lse (heads/tp) and the statistics of the two norms.
    let stats_per_norm: u128 = if input.rms_norm { 1 } else { 2 };
    let fp32 = (input.heads / input.tp) as u128 + 2 * stats_per_norm;
    tokens(input) * (act * act_bytes(input) + residual * residual_bytes(input) + fp32 * 4)
}

/// Bytes of one microbatch's set on a stage of `layers` layers (`last`: it holds the logits).
pub fn stage_activation_bytes(input: &PlanInput, layers: usize, last: bool) -> u128 {
    let per_layer = activation_bytes_per_microbatch_layer(input);
    let n = tokens(input);
    let c = input.hidden as u128;
    // residuals[0] (the block input) and the block output (final norm output on the last stage).
    let block = n * c * (residual_bytes(input) + if last { act_bytes(input) } else { residual_bytes(input) });
    // The logits (B, T, V/tp) and the cross entropy's 3 fp32 statistics per token.
    let logits = if last { n * (input.padded_vocab / input.tp) as u128 * act_bytes(input) + 3 * n * 4 } else { 0 };
    let layers_bytes = match input.recompute {
        Recompute::None | Recompute::Selective => per_layer * layers as u128,
        // `--recompute-granularity full --recompute-method uniform` (1 layer per unit): only each
        // layer's input `(B, T, C)` is kept; backward rebuilds one layer at a time.
        Recompute::Full => n * c * residual_bytes(input) * layers as u128 + per_layer.min(per_layer * layers as u128),
    };
    layers_bytes + block + logits
}

/// Buffers a rank allocates once whatever the microbatches in flight: the block's gradient of
/// the residual stream `d_residual` (`C`), the backward scratch shared by all layers
/// (`BackwardScratch`: `d_branch` and `d_norm` `2C`; `ModuleScratch`: `d_context` `q/tp`,
/// `d_qkv` `3q/tp` — plus the grouped `d_qkv` `(q + 2kv)/tp` with GQA —, `d_act` `F/tp`,
/// `d_fc1` `gates·F/tp`), all per token in the activation dtype except the residual-dtype
/// `d_residual`/`d_branch`; the output layer's input gradient `d_hidden` (`C`, last stage)
/// and the embedding's `d_embedding` (`C`, first stage); a pipeline stage's received
/// activation or gradient `(B, T, C)` (pp > 1).
pub fn workspace_bytes(input: &PlanInput, stage: usize) -> u128 {
    let (c, q, grouped, gates, f) = widths(input);
    let gqa = input.query_groups != input.heads;
    let n = tokens(input);
    let (first, last) = (stage == 0, stage + 1 == input.pp);
    let residual = 2 * c; // d_residual, d_branch
    let act = c + q + 3 * q + if gqa { grouped } else { 0 } + f + gates * f;
    let ends = c * (u128::from(last) + u128::from(first));
    let p2p = if input.pp > 1 { c } else { 0 };
    n * (residual * residual_bytes(input) + (act + ends + p2p) * act_bytes(input))
}
