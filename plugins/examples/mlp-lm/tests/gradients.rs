//! `swiglu-mlp-lm` on the CPU backend against the naive f64 reference (tests/reference.rs):
//! forward loss and logits parity, and every parameter gradient against f64 central finite
//! differences of the reference loss.

mod reference;

use megatron_core::{Backend, Batch, HostBuffer, Mode, Model, ParallelContext};
use megatron_cpu::CpuBackend;
use megatron_example_mlp_lm::init::SplitMix64;
use megatron_example_mlp_lm::{MlpLm, MlpLmConfig};
use reference::RefModel;
use std::sync::Arc;

const LAYERS: usize = 2;
const HIDDEN: usize = 8;
const FFN: usize = 6;
const VOCAB: usize = 11; // padded to 12: the padding row must get no gradient

fn tiny_model() -> anyhow::Result<(MlpLm, Arc<dyn Backend>)> {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::with_threads(1)?);
    let mut config = MlpLmConfig::new(LAYERS, HIDDEN, VOCAB);
    config.ffn_hidden_size = Some(FFN);
    config.make_vocab_size_divisible_by = 4;
    config.layernorm_epsilon = 1e-5;
    let mut model = MlpLm::new(config, backend.clone(), &ParallelContext::single())?;
    // O(1) random values everywhere (norm weights included) so every path carries gradient.
    for (i, p) in model.params_mut().into_iter().enumerate() {
        let values = SplitMix64::new(99, i as u64).normals(p.value.numel(), 0.5);
        let shape = p.value.shape().to_vec();
        p.value = backend.from_host(HostBuffer::F32(values), &shape)?;
    }
    Ok((model, backend))
}

fn reference_of(model: &MlpLm, backend: &dyn Backend) -> anyhow::Result<RefModel> {
    let params = model
        .params()
        .iter()
        .map(|p| Ok(backend.to_host(&p.value)?.to_f32_vec().into_iter().map(f64::from).collect()))
        .collect::<anyhow::Result<Vec<Vec<f64>>>>()?;
    Ok(RefModel { layers: LAYERS, hidden: HIDDEN, ffn: FFN, vocab: 12, eps: 1e-5, params })
}

fn batch() -> Batch {
    Batch {
        micro_batch_size: 2,
        seq_length: 3,
        tokens: vec![1, 5, 10, 0, 3, 3],
        labels: vec![5, 10, 2, 3, 3, 7],
        loss_mask: vec![1.0, 1.0, 0.0, 1.0, 1.0, 1.0],
        seed: 0,
    }
}

#[test]
fn forward_matches_the_f64_reference() -> anyhow::Result<()> {
    let (mut model, backend) = tiny_model()?;
    let reference = reference_of(&model, backend.as_ref())?;
    let b = batch();
    let report = model.forward(&b, Mode::Eval)?;
    let want = reference.loss(&b.tokens, &b.labels, &b.loss_mask);
    // f32 kernels against f64: relative 1e-5 on a sum of five O(1) losses.
    assert!((report.loss_sum - want).abs() <= 1e-5 * want.abs(), "loss {} vs reference {want}", report.loss_sum);
    assert_eq!(report.num_tokens, 5.0);
    let logits = backend.to_host(&model.logits(&b.tokens, 2, 3)?)?.to_f32_vec();
    for (got, want) in logits.iter().zip(reference.logits(&b.tokens)) {
        assert!((*got as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()), "logit {got} vs {want}");
    }
    Ok(())
}

#[test]
fn gradients_match_f64_finite_differences() -> anyhow::Result<()> {
    let (mut model, backend) = tiny_model()?;
    let mut reference = reference_of(&model, backend.as_ref())?;
    let b = batch();
    model.zero_grad()?;
    model.forward(&b, Mode::Train)?;
    model.backward(1.0)?;
    let grads: Vec<Vec<f32>> =
        model.params().iter().map(|p| Ok(backend.to_host(&p.grad)?.to_f32_vec())).collect::<anyhow::Result<_>>()?;
    let h = 1e-5;
    let mut worst = 0.0f64;
    for (pi, grad) in grads.iter().enumerate() {
        for (j, &g) in grad.iter().enumerate() {
            let orig = reference.params[pi][j];
            reference.params[pi][j] = orig + h;
            let up = reference.loss(&b.tokens, &b.labels, &b.loss_mask);
            reference.params[pi][j] = orig - h;
            let down = reference.loss(&b.tokens, &b.labels, &b.loss_mask);
            reference.params[pi][j] = orig;
            let fd = (up - down) / (2.0 * h);
            // The backend computes in f32: allow 1e-4 absolute plus 1e-3 relative.
            let err = (g as f64 - fd).abs();
            worst = worst.max(err);
            assert!(err <= 1e-4 + 1e-3 * fd.abs(), "param {pi} element {j}: backward {g} vs finite difference {fd}");
        }
    }
    // The padding vocabulary row (id 11) is never a token or a label: zero embedding gradient.
    assert!(grads[0][11 * HIDDEN..].iter().all(|&g| g == 0.0));
    println!("worst |backward - finite difference| = {worst:.2e}");
    Ok(())
}

#[test]
fn backward_accumulates_and_zero_grad_clears() -> anyhow::Result<()> {
    let (mut model, backend) = tiny_model()?;
    let b = batch();
    let mut once = Vec::new();
    for round in 0..2 {
        model.forward(&b, Mode::Train)?;
        model.backward(0.5)?;
        let g = backend.to_host(&model.params()[2].grad)?.to_f32_vec();
        if round == 0 {
            once = g;
        } else {
            for (two, one) in g.iter().zip(&once) {
                assert!((two - 2.0 * one).abs() <= 1e-5 * (1.0 + one.abs()), "{two} vs 2 x {one}");
            }
        }
    }
    model.zero_grad()?;
    assert!(backend.to_host(&model.params()[2].grad)?.to_f32_vec().iter().all(|&g| g == 0.0));
    assert!(model.backward(1.0).is_err(), "backward without a training forward must fail");
    Ok(())
}
