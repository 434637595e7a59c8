//! The finetuning classifier (pooler + 3-way `classification_head` on a post-LN BERT encoder
//! with erf GeLU, as an imported Hugging Face model): every trained parameter's gradient
//! matches finite differences of the mean cross-entropy; the pretrained pooler is carried
//! over and the LM head is not trained.

use megatron_bert::{BertBatch, BertClassifier, BertConfig, BertModel, LayerNormPlacement};
use megatron_core::{Backend, Mode, ParallelContext, Param};
use megatron_cpu::CpuBackend;
use megatron_transformer::grad_check::{check_params, worst};
use std::sync::Arc;

fn batch() -> BertBatch {
    let (b, s) = (3, 8);
    let lengths = vec![8, 5, 3];
    let mut tokens = vec![0; b * s];
    let mut types = vec![0; b * s];
    for (r, &len) in lengths.iter().enumerate() {
        for t in 0..len {
            tokens[r * s + t] = ((r * 7 + t * 13) % 50) as i32;
            types[r * s + t] = (t >= len / 2) as i32;
        }
    }
    let n = b * s;
    BertBatch {
        batch: b,
        seq: s,
        tokens,
        types,
        lengths,
        labels: vec![0; n],
        loss_mask: vec![0.0; n],
        is_random: vec![2, 0, 1],
        seed: 1,
    }
}

fn params(m: &mut BertClassifier) -> Vec<&mut Param> {
    m.params_mut()
}

#[test]
fn classifier_gradients_match_finite_differences() {
    check(0.0, Mode::Eval);
}

/// Training mode with dropout (encoder and pooled output): the masks are a function of the
/// batch seed, so the training forward is a deterministic function to differentiate.
#[test]
fn classifier_gradients_with_dropout_match_finite_differences() {
    check(0.3, Mode::Train);
}

fn check(dropout: f32, loss_mode: Mode) {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let cfg = BertConfig {
        num_layers: 2,
        hidden_size: 16,
        num_attention_heads: 2,
        ffn_hidden_size: Some(24),
        max_position_embeddings: 16,
        vocab_size: 50,
        make_vocab_size_divisible_by: 32,
        layernorm: LayerNormPlacement::Post,
        gelu_erf: true,
        hidden_dropout: dropout,
        attention_dropout: dropout,
        init_method_std: 0.3,
        seed: 5,
        ..Default::default()
    };
    let bert = BertModel::new(cfg, backend.clone(), ParallelContext::single()).unwrap();
    let pooler = backend.to_host(&bert.binary_head.as_ref().unwrap().pooler_weight.value).unwrap().to_f32_vec();
    let mut model = BertClassifier::new(bert, 3, 77).unwrap();
    assert_eq!(backend.to_host(&model.head.pooler_weight.value).unwrap().to_f32_vec(), pooler);
    let names: Vec<String> = model.params().iter().map(|p| p.name.clone()).collect();
    assert!(names.iter().all(|n| !n.starts_with("lm_head") && n != "output_layer.bias" && n != "binary_head.weight"));
    assert!(names.contains(&"classification_head.weight".to_string()));
    let x = batch();
    for p in model.params_mut() {
        backend.fill(&mut p.grad, 0.0).unwrap();
    }
    model.forward(&x, Mode::Train).unwrap();
    model.backward(1.0 / 3.0).unwrap();
    let mut loss = |m: &mut BertClassifier| Ok(m.forward(&x, loss_mode)?.loss_sum / 3.0);
    let samples = check_params(&mut model, backend.as_ref(), params, &|_| true, &mut loss, 3, 1e-2, 1e-2).unwrap();
    let w = worst(&samples).unwrap();
    println!("{} samples, worst: {w:?}", samples.len());
    assert!(w.rel_err < 2e-2, "worst gradient sample {w:?}");
}
