//! bf16/fp16 BERT (SPEC §6.7): half parameters and activations (the attention softmax and
//! its log-sum-exp, norm statistics, cross-entropy statistics and the binary head's pooler and
//! sentence-order loss in fp32), fp32 gradient buffers. The same model in fp32 is the
//! reference: the lm loss, the sop loss and every gradient of one microbatch agree within the
//! half type's rounding (tolerances below), for the pre-LN (Megatron) and the post-LN with
//! erf GeLU (Hugging Face) layouts, with padding (3 rows of 8, 5 and 3 tokens) and a padded
//! vocabulary.

mod common;

use megatron_bert::{BertBatch, BertConfig, BertModel, LayerNormPlacement};
use megatron_core::half_parity::{assert_half_matches_fp32, assert_param_dtypes, concat_grads};
use megatron_core::{Backend, DType, Mode, ParallelContext};
use megatron_cpu::CpuBackend;
use std::sync::Arc;

fn config(placement: LayerNormPlacement, gelu_erf: bool) -> BertConfig {
    BertConfig {
        num_layers: 2,
        hidden_size: 32,
        num_attention_heads: 4,
        ffn_hidden_size: Some(64),
        max_position_embeddings: 16,
        vocab_size: 50,
        make_vocab_size_divisible_by: 32,
        num_tokentypes: 2,
        bert_binary_head: true,
        layernorm: placement,
        gelu_erf,
        hidden_dropout: 0.0,
        attention_dropout: 0.0,
        init_method_std: 0.1,
        seed: 5,
        ..Default::default()
    }
}

fn batch() -> BertBatch {
    common::masked_batch(0, 3)
}

/// (lm loss, sop loss), concatenated gradients and the model after one microbatch.
fn losses_and_grads(c: BertConfig) -> (f64, f64, Vec<f32>, BertModel) {
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut m = BertModel::new(c, be.clone(), ParallelContext::single()).unwrap();
    m.zero_grads().unwrap();
    let l = m.forward_bert(&batch(), Mode::Train).unwrap();
    m.backward_bert(1.0 / l.lm_tokens as f32, 1.0 / l.sop_rows as f32).unwrap();
    let g = concat_grads(&m.params(), be.as_ref());
    (l.lm_loss_sum / l.lm_tokens, l.sop_loss_sum / l.sop_rows, g, m)
}

fn check(base: BertConfig, what: &str, dtype: DType, loss_tol: f64, grad_tol: f64) {
    let (lm32, sop32, g32, _) = losses_and_grads(base.clone());
    let mut c = base;
    c.params_dtype = dtype;
    let (lmh, soph, gh, m) = losses_and_grads(c);
    assert_param_dtypes(&m.params(), |_| dtype);
    let losses = [("lm loss", lmh, lm32), ("sop loss", soph, sop32)];
    assert_half_matches_fp32(&format!("{what} {dtype}"), &losses, &gh, &g32, loss_tol, grad_tol);
}

// Tolerances as the GPT's, T5's and hybrid's: bf16 keeps 8 significant bits (2^-9 ≈ 2e-3
// relative rounding per value), fp16 11 bits (about 8x tighter).
#[test]
fn bf16_bert_matches_fp32_within_bf16_rounding() {
    check(config(LayerNormPlacement::Pre, false), "pre-LN", DType::BF16, 1e-2, 6e-2);
    check(config(LayerNormPlacement::Post, true), "post-LN erf", DType::BF16, 1e-2, 6e-2);
}

#[test]
fn fp16_bert_matches_fp32_within_fp16_rounding() {
    check(config(LayerNormPlacement::Pre, false), "pre-LN", DType::F16, 2e-3, 1e-2);
    check(config(LayerNormPlacement::Post, true), "post-LN erf", DType::F16, 2e-3, 1e-2);
}
