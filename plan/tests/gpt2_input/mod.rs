//! The planner input of GPT-2 124M (Megatron's GPT-2 small: 12 layers, hidden 768, vocabulary
//! padded to 50304) on one rank in fp32 with Adam, shared by the planner's tests.

use megatron_plan::*;

/// GPT-2 124M at sequence length `seq`, micro batch `mb` and `m` microbatches.
pub fn gpt2(seq: usize, mb: usize, m: usize) -> PlanInput {
    PlanInput {
        num_layers: 12,
        hidden: 768,
        heads: 12,
        query_groups: 12,
        kv_channels: 64,
        ffn: 3072,
        swiglu: false,
        padded_vocab: 50304,
        max_position_embeddings: 1024,
        learned_positions: true,
        untied: false,
        seq,
        micro_batch: mb,
        num_microbatches: m,
        tp: 1,
        pp: 1,
        dp: 1,
        virtual_pp: 1,
        optimizer_floats: 2,
        distributed_optimizer: false,
        precision: Precision::Fp32,
        recompute: Recompute::None,
        bucket_elems: None,
        fp32_residual: false,
        rms_norm: false,
        sequence_parallel: false,
        cp: 1,
    }
}
