//! Logits, loss and every gradient of our GPT against Hugging Face `GPT2LMHeadModel` on the
//! `gpt2_grad_fixture` (2 layers, hidden 64, 4 heads, vocab 1024, tied, dropout 0).
//!
//! Errors are measured per tensor as `max|ours - hf| / max|hf|`.

mod common;

use common::*;
use megatron_core::{Batch, Mode, Model, ParallelContext};
use megatron_gpt::{export_hf_gpt2, load_hf_gpt2, Export, GptConfig, GptModel};
use safetensors::{Dtype, SafeTensors};

fn floats(st: &SafeTensors, name: &str) -> Vec<f32> {
    let v = st.tensor(name).unwrap();
    assert_eq!(v.dtype(), Dtype::F32, "{name}");
    v.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Token ids are stored as int64 in the fixture; we use int32.
fn ids(st: &SafeTensors, name: &str) -> Vec<i32> {
    let v = st.tensor(name).unwrap();
    assert_eq!(v.dtype(), Dtype::I64, "{name}");
    v.data().chunks_exact(8).map(|c| i32::try_from(i64::from_le_bytes(c.try_into().unwrap())).unwrap()).collect()
}

fn rel_err(ours: &[f32], reference: &[f32]) -> f64 {
    assert_eq!(ours.len(), reference.len());
    let max_ref = reference.iter().fold(0f64, |m, &x| m.max(x.abs() as f64));
    let max_diff = ours.iter().zip(reference).fold(0f64, |m, (&a, &b)| m.max((a as f64 - b as f64).abs()));
    max_diff / max_ref
}

#[test]
fn gpt_matches_hf_gpt2_logits_loss_and_gradients() {
    let Some(dir) = shared_data("gpt2_grad_fixture") else {
        println!("SKIP: shared/data/gpt2_grad_fixture not found");
        return;
    };
    let read = |f: &str| std::fs::read(dir.join(f)).unwrap();
    let (model_bytes, batch_bytes, grad_bytes) =
        (read("model.safetensors"), read("batch.safetensors"), read("grads.safetensors"));
    let weights = SafeTensors::deserialize(&model_bytes).unwrap();
    let data = SafeTensors::deserialize(&batch_bytes).unwrap();
    let grads = SafeTensors::deserialize(&grad_bytes).unwrap();
    let reference: serde_json::Value = serde_json::from_slice(&read("reference.json")).unwrap();
    let ref_loss = reference["loss"].as_f64().unwrap();

    let (b, s, vocab) = (2, 32, 1024);
    let mut config = GptConfig::new(2, 64, 4, s, vocab);
    config.max_position_embeddings = 64;
    config.hidden_dropout = 0.0;
    config.attention_dropout = 0.0;
    let mut model = GptModel::new(config, backend(), ParallelContext::single()).unwrap();
    assert_eq!(model.padded_vocab_size(), 1024);
    load_hf_gpt2(&mut model, &weights).unwrap();

    // The inverse mapping reproduces every HF tensor bit for bit.
    for (name, shape, values) in export_hf_gpt2(&model, Export::Values).unwrap() {
        assert_eq!(shape, weights.tensor(&name).unwrap().shape(), "{name}");
        assert_eq!(values, floats(&weights, &name), "round trip of {name}");
    }

    let tokens = ids(&data, "input_ids");
    let labels = ids(&data, "labels");
    let logits = model.logits(&tokens, b, s).unwrap();
    let logits = model.backend().to_host(&logits).unwrap().to_f32_vec();
    let logits_err = rel_err(&logits, &floats(&data, "logits"));
    println!("logits: max|ours-hf|/max|hf| = {logits_err:.3e}");
    assert!(logits_err < 1e-5, "logits relative error {logits_err:.3e}");

    model.zero_grad().unwrap();
    let batch = Batch { micro_batch_size: b, seq_length: s, tokens, labels, loss_mask: vec![1.0; b * s], seed: 0 };
    let report = model.forward(&batch, Mode::Train).unwrap();
    assert_eq!(report.num_tokens, 64.0);
    let loss = report.loss_sum / report.num_tokens;
    let loss_err = (loss - ref_loss).abs() / ref_loss;
    println!("loss: ours {loss:.9} hf {ref_loss:.9} rel err {loss_err:.3e}");
    assert!(loss_err < 1e-5, "loss {loss} vs {ref_loss}");

    model.backward(1.0 / 64.0).unwrap();
    let ours = export_hf_gpt2(&model, Export::Grads).unwrap();
    assert_eq!(ours.len(), grads.names().len(), "every HF gradient is compared");
    let mut worst = (String::new(), 0f64);
    for (name, shape, g) in ours {
        assert_eq!(shape, grads.tensor(&name).unwrap().shape(), "{name}");
        let err = rel_err(&g, &floats(&grads, &name));
        if err > worst.1 {
            worst = (name.clone(), err);
        }
        assert!(err < 1e-4, "gradient of {name}: relative error {err:.3e}");
    }
    println!("worst gradient: {} with max|ours-hf|/max|hf| = {:.3e}", worst.0, worst.1);
}
