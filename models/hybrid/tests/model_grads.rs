//! Whole-model checks of a tiny hybrid model (`M*-M`): finite differences of a few elements of
//! every parameter (embedding, Mamba mixers, attention, MLP, norms, tied output layer, masked
//! cross entropy), the chunk size not changing the loss, and the registry names.

use megatron_core::{Backend, Batch, Mode, Model, ParallelContext, Param};
use megatron_cpu::CpuBackend;
use megatron_hybrid::{HybridConfig, HybridModel};
use megatron_transformer::grad_check::{check_params, worst};
use std::sync::Arc;

const VOCAB: usize = 40;
const SEQ: usize = 7;

fn config(pattern: &str) -> HybridConfig {
    let mut c = HybridConfig::new(pattern, 16, 2, SEQ, VOCAB);
    c.mamba_head_dim = 4;
    c.mamba_num_groups = 2;
    c.mamba_state_dim = 4;
    c.mamba_chunk_size = 3; // 7 steps: chunks of 3, 3, 1
    c.ffn_hidden_size = Some(24);
    c.hidden_dropout = 0.0;
    c.attention_dropout = 0.0;
    c.init_method_std = 0.2;
    c.make_vocab_size_divisible_by = 16; // 40 -> 48: padded rows masked
    c.seed = 11;
    c
}

fn model(c: HybridConfig) -> HybridModel {
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    HybridModel::new(c, "hybrid", be, ParallelContext::single()).unwrap()
}

fn batch() -> Batch {
    let n = 2 * SEQ;
    Batch {
        micro_batch_size: 2,
        seq_length: SEQ,
        tokens: (0..n).map(|i| ((i * 7 + 3) % VOCAB) as i32).collect(),
        labels: (0..n).map(|i| ((i * 5 + 1) % VOCAB) as i32).collect(),
        loss_mask: (0..n).map(|i| if i % 5 == 4 { 0.0 } else { 1.0 }).collect(),
        seed: 3,
    }
}

fn params(m: &mut HybridModel) -> Vec<&mut Param> {
    m.params_mut()
}

#[test]
fn hybrid_gradients_match_finite_differences() {
    let mut m = model(config("M*-M"));
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let b = batch();
    m.zero_grad().unwrap();
    m.forward(&b, Mode::Train).unwrap();
    m.backward(1.0).unwrap();
    // embedding + 2 x (norm + 8 mixer) + (norm + qkv + proj) + (norm + fc1 + fc2) + final norm.
    assert_eq!(m.params().len(), 1 + 18 + 3 + 3 + 1);
    let mut loss = |m: &mut HybridModel| Ok(m.forward(&b, Mode::Eval)?.loss_sum);
    let samples = check_params(&mut m, be.as_ref(), params, &|_| true, &mut loss, 3, 1e-2, 1e-2).unwrap();
    let w = worst(&samples).unwrap();
    println!("{} samples, worst: {w:?}", samples.len());
    assert!(w.rel_err < 2e-2, "worst gradient sample {w:?}");
}

#[test]
fn the_chunk_size_does_not_change_the_loss() {
    let loss = |chunk: usize| {
        let mut c = config("MM");
        c.mamba_chunk_size = chunk;
        model(c).forward(&batch(), Mode::Eval).unwrap().loss_sum
    };
    let (a, b, c) = (loss(1), loss(4), loss(128));
    assert!((a - b).abs() < 1e-4 * a.abs() && (a - c).abs() < 1e-4 * a.abs(), "{a} {b} {c}");
}

#[test]
fn bad_configs_are_clear_errors() {
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut c = config("M*E");
    let e = HybridModel::new(c.clone(), "hybrid", be.clone(), ParallelContext::single()).err().unwrap().to_string();
    assert!(e.contains("`E`") && e.contains("--plugin libmegatron_moe.so"), "{e}");
    c.hybrid_layer_pattern = "MM".into();
    c.mamba_num_groups = 3;
    let e = HybridModel::new(c, "hybrid", be, ParallelContext::single()).err().unwrap().to_string();
    assert!(e.contains("--mamba-num-groups"), "{e}");
}
