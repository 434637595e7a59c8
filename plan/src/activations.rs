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
//!
//! Context parallelism: every per-token count is of the rank's `B·T/cp` tokens.
//! Sequence parallelism (`tp > 1`): `ln1_out`, `ln2_out`, `h1`, the layer outputs, the norm
//! statistics, `residuals[0]` and the block output (the final norm's output) hold the rank's
//! `1/tp` token shard; qkv, context, `lse` and the MLP activations are split by TP already, the
//! gathered linear inputs are temporaries (models/transformer/src/sequence_parallel.rs), and the
//! logits keep every token (the lm-head input is gathered).

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

/// Tokens of one microbatch on this rank (`B·T/cp`).
fn tokens(input: &PlanInput) -> u128 {
    (input.micro_batch * input.seq) as u128 / input.cp.max(1) as u128
}

/// Tokens of the sequence-parallel shard: `tokens / tp` with `--sequence-parallel`.
fn shard_tokens(input: &PlanInput) -> u128 {
    if input.sequence_parallel && input.tp > 1 {
        tokens(input) / input.tp as u128
    } else {
        tokens(input)
    }
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
    // Every token: qkv (per-head), qkv_grouped (GQA only), context, fc1_out, act_out; lse.
    let act = 3 * q + if gqa { grouped } else { 0 } + q + gates * f + f;
    let lse = (input.heads / input.tp) as u128;
    // The token shard (all tokens without SP): ln1_out, ln2_out; h1 and the layer output (the
    // next residuals[] entry); the statistics of the two norms.
    let stats_per_norm: u128 = if input.rms_norm { 1 } else { 2 };
    let shard = 2 * c * act_bytes(input) + 2 * c * residual_bytes(input) + 2 * stats_per_norm * 4;
    tokens(input) * (act * act_bytes(input) + lse * 4) + shard_tokens(input) * shard
}

/// Bytes the decoder keeps per microbatch on a stage of `layers` layers (`last`: it ends with
/// the final norm): the layers, `residuals[0]`, the block output and the final norm's
/// statistics — what `TransformerBlock::saved_activations_mut` lists.
pub fn decoder_activation_bytes(input: &PlanInput, layers: usize, last: bool) -> u128 {
    let per_layer = activation_bytes_per_microbatch_layer(input);
    let ns = shard_tokens(input);
    let c = input.hidden as u128;
    // residuals[0] (the block input) and the block output (final norm output on the last stage).
    let out = if last { act_bytes(input) } else { residual_bytes(input) };
    let stats: u128 = if !last {
        0
    } else if input.rms_norm {
        1
    } else {
        2
    };
    let block = ns * (c * (residual_bytes(input) + out) + stats * 4);
    let layers_bytes = match input.recompute {
        Recompute::None | Recompute::Selective => per_layer * layers as u128,
        // `--recompute-granularity full --recompute-method uniform` (1 layer per unit): only each
        // layer's input `(B, T, C)` (its shard with SP) is kept; backward rebuilds one layer at a
        // time.
        Recompute::Full => ns * c * residual_bytes(input) * layers as u128 + per_layer.min(per_layer * layers as u128),
    };
    layers_bytes + block
}

/// Bytes of one microbatch's set on a stage of `layers` layers (`last`: it holds the logits).
pub fn stage_activation_bytes(input: &PlanInput, layers: usize, last: bool) -> u128 {
    let n = tokens(input);
    // The logits (B, T, V/tp) of every token of the rank (SP gathers the lm-head input) and the
    // cross entropy's 3 fp32 statistics per token.
    let logits = if last { n * (input.padded_vocab / input.tp) as u128 * act_bytes(input) + 3 * n * 4 } else { 0 };
    decoder_activation_bytes(input, layers, last) + logits
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
    let (n, ns) = (tokens(input), shard_tokens(input));
    let (first, last) = (stage == 0, stage + 1 == input.pp);
    // The token shard with SP: d_residual, d_branch (residual dtype), d_norm, d_hidden,
    // d_embedding and the received pipeline tensor; every token: the module scratch.
    let residual = 2 * c;
    let sharded = c + c * (u128::from(last) + u128::from(first)) + if input.pp > 1 { c } else { 0 };
    let act = q + 3 * q + if gqa { grouped } else { 0 } + f + gates * f;
    ns * (residual * residual_bytes(input) + sharded * act_bytes(input)) + n * act * act_bytes(input)
}
