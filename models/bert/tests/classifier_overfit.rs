//! The finetuning classifier learns: a tiny post-LN BERT with dropout, trained with Adam and
//! clipping as `megatron finetune` trains it, fits 32 padded rows whose label depends on
//! their content (a token near the start is below the vocabulary's middle). A broken
//! gradient path (pooler, `[CLS]` row, padding lengths, dropout masks, optimizer plumbing)
//! leaves it at the majority class.

use megatron_bert::{BertBatch, BertClassifier, BertConfig, BertModel, LayerNormPlacement};
use megatron_core::{Backend, Mode, Optimizer, ParallelContext};
use megatron_cpu::CpuBackend;
use std::sync::Arc;

const ROWS: usize = 32;
const SEQ: usize = 12;
const VOCAB: usize = 40;

/// Rows `[CLS] a.. [SEP] b.. [SEP] pad..` with lengths 6..=12 and labels from token 2.
fn data() -> BertBatch {
    let mut state = 12345u64;
    let mut next = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    let (mut tokens, mut types, mut lengths, mut labels) = (vec![0; ROWS * SEQ], vec![0; ROWS * SEQ], vec![], vec![]);
    for r in 0..ROWS {
        let len = 6 + next() % (SEQ - 5);
        let half = len / 2;
        for t in 0..len {
            let id = match t {
                0 => 1,                              // [CLS]
                _ if t == half || t + 1 == len => 2, // [SEP]
                _ => 4 + next() % (VOCAB - 4),
            };
            tokens[r * SEQ + t] = id as i32;
            types[r * SEQ + t] = i32::from(t > half);
        }
        lengths.push(len);
        labels.push(i32::from(tokens[r * SEQ + 2] < (VOCAB / 2) as i32));
    }
    let n = ROWS * SEQ;
    BertBatch {
        batch: ROWS,
        seq: SEQ,
        tokens,
        types,
        lengths,
        labels: vec![0; n],
        loss_mask: vec![0.0; n],
        is_random: labels,
        seed: 0,
    }
}

#[test]
fn classifier_overfits_a_tiny_training_set() {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let cfg = BertConfig {
        num_layers: 2,
        hidden_size: 32,
        num_attention_heads: 2,
        ffn_hidden_size: Some(64),
        max_position_embeddings: SEQ,
        vocab_size: VOCAB,
        make_vocab_size_divisible_by: 8,
        layernorm: LayerNormPlacement::Post,
        gelu_erf: true,
        hidden_dropout: 0.1,
        attention_dropout: 0.1,
        seed: 3,
        ..Default::default()
    };
    let bert = BertModel::new(cfg, backend.clone(), ParallelContext::single()).unwrap();
    let mut model = BertClassifier::new(bert, 2, 9).unwrap();
    let mut adam = megatron_optim::Adam::new(megatron_optim::AdamConfig::default()).unwrap();
    let mut x = data();
    let ones = x.is_random.iter().filter(|&&l| l == 1).count();
    let majority = ones.max(ROWS - ones);
    let accuracy = |m: &mut BertClassifier, x: &BertBatch| {
        let out = m.forward(x, Mode::Eval).unwrap();
        (out.predictions.iter().zip(&x.is_random).filter(|(p, l)| **p as i32 == **l).count(), out.loss_sum)
    };
    let (start, start_loss) = accuracy(&mut model, &x);
    let ctx = ParallelContext::single();
    for step in 0..60u64 {
        for p in model.params_mut() {
            backend.fill(&mut p.grad, 0.0).unwrap();
        }
        x.seed = 1000 + step;
        model.forward(&x, Mode::Train).unwrap();
        model.backward(1.0 / ROWS as f32).unwrap();
        let mut params = model.params_mut();
        megatron_optim::clip_grad_norm(&mut params, 1.0, backend.as_ref(), &ctx).unwrap();
        adam.step(&mut params, 2e-3, 0.01, backend.as_ref()).unwrap();
    }
    let (end, end_loss) = accuracy(&mut model, &x);
    println!(
        "train accuracy {start}/{ROWS} -> {end}/{ROWS} (majority {majority}), mean loss {:.4} -> {:.4}",
        start_loss / ROWS as f64,
        end_loss / ROWS as f64
    );
    assert!(end == ROWS && end_loss / (ROWS as f64) < 0.1, "did not fit: {end}/{ROWS}, loss {end_loss}");
}
