//! Full activation recomputation of BERT (`--recompute-granularity full`, SPEC §6.9): the
//! layers of a unit keep only the unit's input, their backward re-runs the unit's forward with
//! the same dropout masks. Losses and every gradient (two microbatches accumulated) are
//! bit-identical to keeping the activations: dropout on, pre-LN and post-LN, fp32 and bf16,
//! uniform 1 and 2, block 2, over 3 layers.

mod common;

use megatron_bert::{BertBatch, BertConfig, BertModel, LayerNormPlacement};
use megatron_core::{Backend, DType, Mode, ParallelContext};
use megatron_cpu::CpuBackend;
use megatron_transformer::{FullRecompute, RecomputeMethod};
use std::sync::Arc;

fn config(placement: LayerNormPlacement, dtype: DType) -> BertConfig {
    BertConfig {
        num_layers: 3,
        hidden_size: 16,
        num_attention_heads: 2,
        ffn_hidden_size: Some(32),
        max_position_embeddings: 16,
        vocab_size: 50,
        make_vocab_size_divisible_by: 32,
        num_tokentypes: 2,
        bert_binary_head: true,
        layernorm: placement,
        gelu_erf: placement == LayerNormPlacement::Post,
        hidden_dropout: 0.1,
        attention_dropout: 0.1,
        init_method_std: 0.1,
        seed: 7,
        params_dtype: dtype,
        ..Default::default()
    }
}

/// `seed` varies tokens and dropout.
fn batch(seed: u64) -> BertBatch {
    common::masked_batch(seed as usize, seed)
}

/// The losses of two microbatches and the accumulated gradients.
fn run(c: BertConfig) -> (Vec<f64>, Vec<Vec<f32>>) {
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut m = BertModel::new(c, be.clone(), ParallelContext::single()).unwrap();
    m.zero_grads().unwrap();
    let mut losses = Vec::new();
    for seed in [11, 12] {
        let l = m.forward_bert(&batch(seed), Mode::Train).unwrap();
        losses.extend([l.lm_loss_sum, l.sop_loss_sum]);
        m.backward_bert(1.0 / l.lm_tokens as f32, 1.0 / l.sop_rows as f32).unwrap();
    }
    (losses, m.params().iter().map(|p| be.to_host(&p.grad).unwrap().to_f32_vec()).collect())
}

#[test]
fn full_recompute_is_bit_identical_to_keeping_activations() {
    for placement in [LayerNormPlacement::Pre, LayerNormPlacement::Post] {
        for dtype in [DType::F32, DType::BF16] {
            let base = config(placement, dtype);
            let (l0, g0) = run(base.clone());
            for (method, num_layers) in
                [(RecomputeMethod::Uniform, 1), (RecomputeMethod::Uniform, 2), (RecomputeMethod::Block, 2)]
            {
                let mut c = base.clone();
                c.recompute = Some(FullRecompute { method, num_layers });
                let (l, g) = run(c);
                let what = format!("{placement:?} {dtype} {method:?} {num_layers}");
                assert_eq!(l, l0, "{what}: losses differ");
                assert!(g == g0, "{what}: gradients differ");
            }
        }
    }
}
