//! Activation bytes of one microbatch, from the tensors our layers cache for backward (the
//! `// (B, T, C)` comments of models/transformer): per token and layer the residual stream,
//! the two norm outputs and the attention output (`4C`), `qkv` and the attention context
//! (`(q + 2kv)/tp + q/tp`), the MLP's fc1 output and activation (`(gates + 1) F / tp`), the
//! softmax statistics (`heads/tp`) and the norm statistics (4 floats). Dropout masks are
//! regenerated from seeds and attention never stores `T x T` scores.

use crate::{PlanInput, Precision, Recompute};

fn elem_bytes(input: &PlanInput) -> u128 {
    match input.precision {
        Precision::Fp32 => 4,
        Precision::Half => 2,
    }
}

/// Bytes one layer caches per microbatch without recomputation.
pub fn activation_bytes_per_microbatch_layer(input: &PlanInput) -> u128 {
    let (c, tp) = (input.hidden as u128, input.tp as u128);
    let q = (input.heads * input.kv_channels) as u128;
    let kv = (2 * input.query_groups * input.kv_channels) as u128;
    let gates: u128 = if input.swiglu { 2 } else { 1 };
    let f = input.ffn as u128;
    let per_token = 4 * c + (q + kv) / tp + q / tp + (gates + 1) * f / tp + input.heads as u128 / tp + 4;
    (input.micro_batch * input.seq) as u128 * per_token * elem_bytes(input)
}

/// Bytes stage of `layers` layers keeps for one microbatch under the recompute policy.
pub fn stage_activation_bytes(input: &PlanInput, layers: usize) -> u128 {
    let per_layer = activation_bytes_per_microbatch_layer(input);
    match input.recompute {
        Recompute::None | Recompute::Selective => per_layer * layers as u128,
        Recompute::Full => {
            // Only each layer's input `(B, T, C)` is kept; backward rebuilds one layer at a time.
            let input_bytes = (input.micro_batch * input.seq * input.hidden) as u128 * elem_bytes(input);
            input_bytes * layers as u128 + per_layer.min(per_layer * layers as u128)
        }
    }
}

/// Workspace of one microbatch: on the last stage the fp32 logits `(B, T, V/tp)` and their
/// gradient; everywhere a few `(B, T, C)` and `(B, T, F/tp)` backward buffers.
pub fn workspace_bytes(input: &PlanInput, last_stage: bool) -> u128 {
    let (b, t, c, tp) = (input.micro_batch as u128, input.seq as u128, input.hidden as u128, input.tp as u128);
    let gates: u128 = if input.swiglu { 2 } else { 1 };
    let scratch = b * t * (6 * c + 2 * gates * input.ffn as u128 / tp) * 4;
    let logits = if last_stage { 2 * b * t * (input.padded_vocab as u128 / tp) * 4 } else { 0 };
    scratch + logits
}
