//! Finite-difference checks of a whole tiny BertModel (pre-LN with the binary head, post-LN
//! without it): a few elements of every parameter through the embeddings (word, position,
//! token type), the padding-mask encoder, the LM head (tied projection + bias, padded vocab)
//! and the sentence-order head; plus the padding invariance of the loss.

mod common;

use megatron_bert::{BertBatch, BertConfig, BertModel, LayerNormPlacement};
use megatron_core::{Backend, Mode, ParallelContext, Param};
use megatron_cpu::CpuBackend;
use megatron_transformer::grad_check::{check_params, worst};
use std::sync::Arc;

fn config(placement: LayerNormPlacement, binary: bool) -> BertConfig {
    BertConfig {
        num_layers: 2,
        hidden_size: 16,
        num_attention_heads: 2,
        ffn_hidden_size: Some(24),
        max_position_embeddings: 16,
        vocab_size: 50,
        // Padded to 64: the padded logits must drop out of the loss.
        make_vocab_size_divisible_by: 32,
        num_tokentypes: 2,
        bert_binary_head: binary,
        layernorm: placement,
        hidden_dropout: 0.0,
        attention_dropout: 0.0,
        init_method_std: 0.3,
        seed: 5,
        ..Default::default()
    }
}

fn batch() -> BertBatch {
    common::masked_batch(0, 3)
}

fn total(m: &mut BertModel, x: &BertBatch) -> anyhow::Result<f64> {
    let l = m.forward_bert(x, Mode::Eval)?;
    let sop = if l.sop_rows > 0.0 { l.sop_loss_sum / l.sop_rows } else { 0.0 };
    Ok(l.lm_loss_sum / l.lm_tokens + sop)
}

fn params(m: &mut BertModel) -> Vec<&mut Param> {
    m.params_mut()
}

fn check(cfg: BertConfig, expect_params: usize) {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut model = BertModel::new(cfg, backend.clone(), ParallelContext::single()).unwrap();
    let x = batch();
    model.zero_grads().unwrap();
    let l = model.forward_bert(&x, Mode::Train).unwrap();
    let sop_scale = if l.sop_rows > 0.0 { 1.0 / l.sop_rows as f32 } else { 0.0 };
    model.backward_bert(1.0 / l.lm_tokens as f32, sop_scale).unwrap();
    assert_eq!(model.params().len(), expect_params);
    let mut loss = |m: &mut BertModel| total(m, &x);
    let samples = check_params(&mut model, backend.as_ref(), params, &|_| true, &mut loss, 3, 1e-2, 1e-2).unwrap();
    let w = worst(&samples).unwrap();
    println!("{} samples, worst: {w:?}", samples.len());
    // f32 forward, central differences with eps 1e-2: a few 1e-3 of relative error.
    assert!(w.rel_err < 2e-2, "worst gradient sample {w:?}");
}

#[test]
fn pre_ln_bert_with_binary_head_gradients_match_finite_differences() {
    // word, position, type + 2 x 12 layer params + final LN 2 + LM head 5 + binary head 4.
    check(config(LayerNormPlacement::Pre, true), 3 + 24 + 2 + 5 + 4);
}

#[test]
fn post_ln_bert_without_binary_head_gradients_match_finite_differences() {
    // word, position, type + embedding LN 2 + 2 x 12 layer params + LM head 5; the erf GeLU
    // of imported Hugging Face models in the MLPs and the LM head.
    let mut c = config(LayerNormPlacement::Post, false);
    c.gelu_erf = true;
    check(c, 3 + 2 + 24 + 5);
}

/// What sits in the padded positions (tokens, types, labels without loss mask) changes
/// nothing, in training mode with dropout on as well.
#[test]
fn padding_does_not_change_the_loss() {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut cfg = config(LayerNormPlacement::Pre, true);
    cfg.hidden_dropout = 0.1;
    cfg.attention_dropout = 0.1;
    let mut model = BertModel::new(cfg, backend, ParallelContext::single()).unwrap();
    let x = batch();
    let a = model.forward_bert(&x, Mode::Train).unwrap();
    let mut y = x.clone();
    for (r, &len) in x.lengths.iter().enumerate() {
        for t in len..8 {
            y.tokens[r * 8 + t] = 49;
            y.types[r * 8 + t] = 1;
        }
    }
    let b = model.forward_bert(&y, Mode::Train).unwrap();
    assert_eq!(a, b);
    let c = model.forward_bert(&y, Mode::Eval).unwrap();
    assert_ne!(a.lm_loss_sum, c.lm_loss_sum, "dropout must act in training mode");
}

#[test]
fn bad_batches_are_refused_with_the_field_named() {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut model = BertModel::new(config(LayerNormPlacement::Pre, true), backend, ParallelContext::single()).unwrap();
    let mut x = batch();
    x.lengths[1] = 9;
    assert!(model.forward_bert(&x, Mode::Eval).unwrap_err().to_string().contains("lengths"));
    let mut x = batch();
    x.tokens[0] = 50;
    assert!(model.forward_bert(&x, Mode::Eval).unwrap_err().to_string().contains("token id 50"));
    let mut x = batch();
    x.is_random.pop();
    assert!(model.forward_bert(&x, Mode::Eval).unwrap_err().to_string().contains("is_random"));
}
