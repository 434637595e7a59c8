//! bf16/fp16 GPT (SPEC §6.7): half parameters and activations, fp32 gradient buffers and
//! statistics. The same model in fp32 is the reference: the loss and every gradient of one
//! microbatch must agree within the half type's rounding (stated tolerances below).

mod common;

use common::{backend, batch, tiny_config, tiny_llama_config};
use megatron_core::{DType, Mode, Model, ParallelContext};
use megatron_gpt::{GptConfig, GptModel};

/// Loss and concatenated gradients of one microbatch.
fn loss_and_grads(c: GptConfig) -> (f64, Vec<f32>, GptModel) {
    let mut m = GptModel::new(c.clone(), backend(), ParallelContext::single()).unwrap();
    let b = batch(2, c.seq_length, c.vocab_size, 5);
    let r = m.forward(&b, Mode::Train).unwrap();
    m.backward(1.0 / r.num_tokens as f32).unwrap();
    let bk = backend();
    let g = m.params().iter().flat_map(|p| bk.to_host(&p.grad).unwrap().to_f32_vec()).collect();
    (r.loss_sum / r.num_tokens, g, m)
}

/// `|a - b| / |b|` in the L2 norm.
fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (d / n).sqrt()
}

fn check(base: GptConfig, dtype: DType, fp32_residual: bool, loss_tol: f64, grad_tol: f64) {
    let (l32, g32, _) = loss_and_grads(base.clone());
    let mut c = base;
    c.params_dtype = dtype;
    c.fp32_residual_connection = fp32_residual;
    let (lh, gh, m) = loss_and_grads(c);
    for p in m.params() {
        assert_eq!(p.value.dtype(), dtype, "{} is not {dtype}", p.name);
        assert_eq!(p.grad.dtype(), DType::F32, "{}: gradients accumulate in fp32", p.name);
    }
    let want_residual = if fp32_residual { DType::F32 } else { dtype };
    assert_eq!(m.decoder.residual_dtype(), want_residual);
    let rel = ((lh - l32) / l32).abs();
    assert!(rel < loss_tol, "{dtype}: loss {lh} vs fp32 {l32} (rel {rel:.2e} >= {loss_tol:.0e})");
    let e = rel_l2(&gh, &g32);
    assert!(e < grad_tol, "{dtype}: gradient rel. L2 error {e:.3e} >= {grad_tol:.0e}");
    assert!(e > 0.0, "{dtype}: gradients identical to fp32: the half path did not run");
}

// Tolerances: bf16 keeps 8 significant bits (rel. rounding 2^-9 ≈ 2e-3 per value); after a
// few layers of rounded activations the loss moves by well under 1% and the gradients by a
// few %. fp16 keeps 11 bits: about 8x tighter.
#[test]
fn bf16_gpt_matches_fp32_within_bf16_rounding() {
    check(tiny_config(64, 8), DType::BF16, false, 1e-2, 6e-2);
}

#[test]
fn fp16_gpt_matches_fp32_within_fp16_rounding() {
    check(tiny_config(64, 8), DType::F16, false, 2e-3, 1e-2);
}

#[test]
fn bf16_llama_with_fp32_residual_matches_fp32() {
    check(tiny_llama_config(64, 8), DType::BF16, true, 1e-2, 6e-2);
}

#[test]
fn grad_reduce_in_bf16_keeps_bf16_gradient_buffers() {
    let mut c = tiny_config(64, 8);
    c.params_dtype = DType::BF16;
    c.grad_reduce_in_bf16 = true;
    let m = GptModel::new(c.clone(), backend(), ParallelContext::single()).unwrap();
    assert!(m.params().iter().all(|p| p.grad.dtype() == DType::BF16));
    c.params_dtype = DType::F16;
    let e = GptModel::new(c, backend(), ParallelContext::single()).err().unwrap().to_string();
    assert!(e.contains("--grad-reduce-in-bf16"), "{e}");
}
