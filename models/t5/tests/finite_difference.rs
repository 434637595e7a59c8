//! Finite-difference checks of a whole tiny T5Model (a few elements of every parameter,
//! through both embeddings, encoder and decoder stacks, cross-attention, the final norms, the
//! tied LM head with its bias and the masked cross entropy), in Megatron's configuration and
//! in Hugging Face's (relative buckets, RMSNorm, gated GeLU, no biases, unscaled attention,
//! scaled head), with padding on both sides; and padding invariance.

mod common;

use common::*;
use megatron_core::{Backend, Batch, MemoryOps, Mode, Model, Param};
use megatron_cpu::CpuBackend;
use megatron_t5::{T5Activation, T5Config, T5Model};
use megatron_transformer::grad_check::{check_params, worst};
use std::sync::Arc;

fn params(m: &mut T5Model) -> Vec<&mut Param> {
    m.params_mut()
}

fn check(mut m: T5Model, mode: Mode, expect_params: usize) {
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let b = batch(0);
    m.zero_grad().unwrap();
    m.forward(&b, Mode::Train).unwrap();
    m.backward(1.0).unwrap();
    assert_eq!(m.params().len(), expect_params, "{:?}", m.params().iter().map(|p| &p.name).collect::<Vec<_>>());
    // `mode` Train re-draws the same dropout masks (same batch seed) in every evaluation.
    let mut loss = |m: &mut T5Model| Ok(m.forward(&b, mode)?.loss_sum);
    let samples = check_params(&mut m, be.as_ref(), params, &|_| true, &mut loss, 3, 1e-2, 1e-2).unwrap();
    let w = worst(&samples).unwrap();
    println!("{} samples, worst: {w:?}", samples.len());
    // f32 forward, central differences with eps 1e-2: a few 1e-3 of relative error.
    assert!(w.rel_err < 2e-2, "worst gradient sample {w:?}");
}

#[test]
fn megatron_t5_gradients_match_finite_differences() {
    // word + position embedding, 2 encoder layers x 12, encoder final norm 2,
    // 1 decoder layer x 20 (3 norms x 2, 4 attention linears x 2 twice... see names), decoder final norm 2, lm head bias.
    check(model(config()), Mode::Eval, 2 + 24 + 2 + 20 + 2 + 1);
}

#[test]
fn hf_style_t5_gradients_match_finite_differences() {
    // word embedding, 2 relative tables, 2 encoder layers x 6, encoder final norm,
    // 1 decoder layer x 10, decoder final norm.
    check(model(hf_style()), Mode::Eval, 1 + 2 + 12 + 1 + 10 + 1);
}

/// The untied head (`lm_head.output_layer.weight`, T5 v1.1), unscaled as in T5 v1.1. Init std
/// 0.15 rather than 0.3: with unscaled attention scores the larger weights make the loss so
/// curved that eps-1e-2 central differences of encoder layer 0 are off by 5-30% for most seeds
/// (the tied HF-style check above passes at 0.3 for its seed only); at 0.15 the worst sample is
/// below 3e-3 for seeds 5-8.
#[test]
fn untied_head_t5_gradients_match_finite_differences() {
    let mut c = hf_style();
    c.untie_embeddings_and_output_weights = true;
    c.output_scale = None;
    c.init_method_std = 0.15;
    check(model(c), Mode::Eval, 1 + 2 + 12 + 1 + 10 + 1 + 1);
}

/// ReLU has kinks: a ±1e-2 weight step moves a few of the ~700 pre-activations across zero,
/// and those samples' central differences are off by the kink. So here at least 90% of the
/// samples must agree to 2e-2 (the smooth cases); the ReLU backward itself is checked
/// exactly away from its kink in `host_activations_match_finite_differences`.
#[test]
fn relu_t5_gradients_match_finite_differences() {
    let mut c = config();
    c.activation = T5Activation::Relu;
    let mut m = model(c);
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let b = batch(0);
    m.zero_grad().unwrap();
    m.forward(&b, Mode::Train).unwrap();
    m.backward(1.0).unwrap();
    let mut loss = |m: &mut T5Model| Ok(m.forward(&b, Mode::Eval)?.loss_sum);
    let samples = check_params(&mut m, be.as_ref(), params, &|_| true, &mut loss, 3, 1e-2, 1e-2).unwrap();
    let good = samples.iter().filter(|s| s.rel_err < 2e-2).count();
    println!("{good} of {} samples within 2e-2, worst {:?}", samples.len(), worst(&samples));
    assert!(good * 10 >= samples.len() * 9, "{good} of {} samples within 2e-2", samples.len());
}

/// The host ReLU and gated GeLU backward against central differences (f32 inputs kept away
/// from ReLU's kink).
#[test]
fn host_activations_match_finite_differences() {
    use megatron_core::HostBuffer;
    use megatron_t5::host::{geglu_backward, geglu_forward, relu_backward, relu_forward};
    let be = CpuBackend::new();
    let x: Vec<f32> = (0..12).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.31 + 0.05).collect();
    let g: Vec<f32> = (0..12).map(|i| ((i * 13 % 7) as f32 - 3.0) * 0.2).collect();
    for gated in [false, true] {
        let (xs, os): (Vec<usize>, Vec<usize>) =
            if gated { (vec![2, 6], vec![2, 3]) } else { (vec![2, 6], vec![2, 6]) };
        let gv = &g[..os.iter().product::<usize>()];
        let f = |x: &[f32]| -> f64 {
            let xt = be.from_host(HostBuffer::F32(x.to_vec()), &xs).unwrap();
            let mut o = be.zeros(&os, megatron_core::DType::F32).unwrap();
            if gated {
                geglu_forward(&be, &xt, &mut o).unwrap()
            } else {
                relu_forward(&be, &xt, &mut o).unwrap()
            }
            be.to_host(&o).unwrap().to_f32_vec().iter().zip(gv).map(|(a, b)| (*a as f64) * (*b as f64)).sum()
        };
        let xt = be.from_host(HostBuffer::F32(x.clone()), &xs).unwrap();
        let gt = be.from_host(HostBuffer::F32(gv.to_vec()), &os).unwrap();
        let mut dx = be.zeros(&xs, megatron_core::DType::F32).unwrap();
        if gated {
            geglu_backward(&be, &xt, &gt, &mut dx).unwrap()
        } else {
            relu_backward(&be, &xt, &gt, &mut dx).unwrap()
        }
        let dx = be.to_host(&dx).unwrap().to_f32_vec();
        for i in 0..x.len() {
            let (mut p, mut m) = (x.clone(), x.clone());
            p[i] += 1e-3;
            m[i] -= 1e-3;
            let fd = (f(&p) - f(&m)) / 2e-3;
            assert!((fd - dx[i] as f64).abs() < 2e-3, "gated={gated} element {i}: fd {fd} analytic {}", dx[i]);
        }
    }
}

#[test]
fn t5_with_dropout_gradients_match_finite_differences() {
    let mut c = config();
    c.hidden_dropout = 0.1;
    c.attention_dropout = 0.1;
    check(model(c), Mode::Train, 2 + 24 + 2 + 20 + 2 + 1);
}

/// Tokens at padded positions change nothing: not the loss, not a gradient.
#[test]
fn padding_is_invisible() {
    for c in [config(), hf_style()] {
        let mut m = model(c);
        let grads = |m: &mut T5Model, b: &Batch| {
            m.zero_grad().unwrap();
            let r = m.forward(b, Mode::Train).unwrap();
            m.backward(1.0).unwrap();
            let be = CpuBackend::new();
            let g: Vec<Vec<f32>> = m.params().iter().map(|p| be.to_host(&p.grad).unwrap().to_f32_vec()).collect();
            (r, g)
        };
        let (r0, g0) = grads(&mut m, &batch(0));
        let (r1, g1) = grads(&mut m, &batch(17));
        assert_eq!(r0.num_tokens, 8.0);
        assert_eq!(r0, r1);
        // The embedding rows of the pad tokens (0 and 17) get no gradient from padding.
        assert_eq!(g0, g1);
    }
}

#[test]
fn pipeline_parallelism_is_refused_and_tp_checked() {
    let grid = megatron_core::RankGrid { tp: 1, cp: 1, dp: 1, pp: 2 };
    let ctx = grid.context(0, Arc::new(megatron_core::SingleRankCommunicator));
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let e = T5Model::new(config(), be, ctx).err().expect("pp=2 must be refused").to_string();
    assert!(e.contains("pipeline") && e.contains("--pipeline-model-parallel-size 1"), "{e}");
    let e = T5Config::new(1, 8, 2, 4, 4, 16).validate(3).unwrap_err().to_string();
    assert!(e.contains("--num-attention-heads 2 must be divisible by --tensor-model-parallel-size 3"), "{e}");
}
