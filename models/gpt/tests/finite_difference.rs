//! Finite-difference check of a whole tiny GptModel: a few elements of every parameter,
//! through embedding, both layers, the final norm, the (tied or untied) output layer and the
//! masked cross entropy.

mod common;

use common::*;
use megatron_core::{Batch, Mode, Model, Param};
use megatron_gpt::GptModel;
use megatron_transformer::grad_check::{check_params, worst};
use megatron_transformer::NormKind;

fn params(m: &mut GptModel) -> Vec<&mut Param> {
    m.params_mut()
}

fn check(mut model: GptModel, batch: &Batch, expect_params: usize) {
    let backend = model.backend();
    model.zero_grad().unwrap();
    model.forward(batch, Mode::Train).unwrap();
    model.backward(1.0).unwrap();
    assert_eq!(model.params().len(), expect_params);
    let mut loss = |m: &mut GptModel| Ok(m.forward(batch, Mode::Eval)?.loss_sum);
    let samples = check_params(&mut model, backend.as_ref(), params, &|_| true, &mut loss, 3, 1e-2, 1e-2).unwrap();
    let w = worst(&samples).unwrap();
    println!("{} samples, worst: {w:?}", samples.len());
    // f32 forward, central differences with eps 1e-2: a few 1e-3 of relative error.
    assert!(w.rel_err < 2e-2, "worst gradient sample {w:?}");
}

#[test]
fn tied_gpt_gradients_match_finite_differences() {
    let (vocab, seq) = (64, 8);
    let model = tiny_model(tiny_config(vocab, seq));
    // 2 embeddings + 2 x 12 layer params + final norm 2.
    check(model, &batch(2, seq, vocab, 3), 28);
}

#[test]
fn untied_rmsnorm_swiglu_gpt_gradients_match_finite_differences() {
    let (vocab, seq) = (64, 8);
    let mut c = tiny_config(vocab, seq);
    c.untie_embeddings_and_output_weights = true;
    c.normalization = NormKind::RMSNorm;
    c.swiglu = true;
    c.ffn_hidden_size = Some(24);
    let model = tiny_model(c);
    // 2 embeddings + 2 x 10 layer params (RMSNorm has no bias) + final norm 1 + output layer.
    check(model, &batch(2, seq, vocab, 4), 24);
}

#[test]
fn llama_style_gpt_gradients_match_finite_differences() {
    let (vocab, seq) = (64, 8);
    let mut c = tiny_llama_config(vocab, seq);
    c.add_qkv_bias = true;
    let model = tiny_model(c);
    // word embedding + 2 x (2 norms, qkv weight+bias, proj, fc1, fc2) + final norm + output.
    check(model, &batch(2, seq, vocab, 5), 17);
}

/// `--qk-layernorm` (RMSNorm of every head's q and k, GQA keys normalized per head) with
/// Llama-3.1 rope scaling whose bands fall inside the 8 positions.
#[test]
fn qk_layernorm_and_rope_scaling_gradients_match_finite_differences() {
    let (vocab, seq) = (64, 8);
    let mut c = tiny_llama_config(vocab, seq);
    c.qk_layernorm = true;
    c.rope_scaling = megatron_core::RopeScaling::Llama3 {
        factor: 4.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 16,
    };
    let model = tiny_model(c);
    // word embedding + 2 x (2 norms, qkv, proj, q/k norms, fc1, fc2) + final norm + output.
    check(model, &batch(2, seq, vocab, 6), 19);
}
