//! 30 plain-SGD steps on one repeated batch (dropout on) must clearly lower the loss.

mod common;

use common::*;
use megatron_core::{Mode, Model};

#[test]
fn sgd_on_a_repeated_batch_lowers_the_loss() {
    let (vocab, seq, b) = (64, 16, 4);
    let mut c = tiny_config(vocab, seq);
    c.hidden_size = 32;
    c.num_attention_heads = 4;
    c.init_method_std = 0.02;
    c.hidden_dropout = 0.1;
    c.attention_dropout = 0.1;
    let mut model = tiny_model(c);
    let backend = model.backend();
    let mut data = batch(b, seq, vocab, 9);
    let lr = 0.5;
    let mut losses = Vec::new();
    for step in 0..30u64 {
        data.seed = step;
        model.zero_grad().unwrap();
        let report = model.forward(&data, Mode::Train).unwrap();
        losses.push(report.loss_sum / report.num_tokens);
        model.backward(1.0 / report.num_tokens as f32).unwrap();
        for p in model.params_mut() {
            backend.axpy(&mut p.value, -lr, &p.grad).unwrap();
        }
    }
    let eval = model.forward(&data, Mode::Eval).unwrap();
    let final_loss = eval.loss_sum / eval.num_tokens;
    println!("loss {:.4} -> {:.4} (eval {final_loss:.4})", losses[0], losses[29]);
    assert!((losses[0] - (vocab as f64).ln()).abs() < 0.1, "initial loss {} should be near ln(V)", losses[0]);
    assert!(final_loss < 0.6 * losses[0], "loss went {} -> {final_loss}", losses[0]);
}

#[test]
fn dropout_follows_the_batch_seed_and_backward_needs_a_training_forward() {
    let (vocab, seq) = (64, 8);
    let mut c = tiny_config(vocab, seq);
    c.hidden_dropout = 0.2;
    c.attention_dropout = 0.2;
    let mut model = tiny_model(c);
    assert!(model.backward(1.0).is_err(), "no forward yet");
    let mut data = batch(2, seq, vocab, 1);
    let a = model.forward(&data, Mode::Train).unwrap();
    let b = model.forward(&data, Mode::Train).unwrap();
    assert_eq!(a, b, "same Batch::seed, same masks, same loss");
    data.seed = 2;
    let c = model.forward(&data, Mode::Train).unwrap();
    assert_ne!(a.loss_sum, c.loss_sum, "another seed draws other masks");
    let e1 = model.forward(&data, Mode::Eval).unwrap();
    data.seed = 3;
    let e2 = model.forward(&data, Mode::Eval).unwrap();
    assert_eq!(e1, e2, "eval has no dropout");
    assert!(model.backward(1.0).is_err(), "an eval forward saves nothing for backward");
}
