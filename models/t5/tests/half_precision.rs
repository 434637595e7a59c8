//! bf16/fp16 T5 (SPEC §6.7): half parameters and activations (the attention core, relative
//! position bias, logits and cross entropy in fp32), fp32 gradient buffers. The same model in
//! fp32 is the reference: the loss and every gradient of one microbatch agree within the half
//! type's rounding (tolerances below), for the Megatron-style config (learned positions,
//! LayerNorm, GeLU) and the Hugging Face-style one (relative bias, RMSNorm, gated GeLU).

mod common;

use common::{batch, hf_style};
use megatron_core::half_parity::{assert_half_matches_fp32, assert_param_dtypes, one_step};
use megatron_core::ParallelContext;
use megatron_core::{Backend, DType, Model};
use megatron_cpu::CpuBackend;
use megatron_t5::{T5Config, T5Model};
use std::sync::Arc;

/// Loss, concatenated gradients and the model after one microbatch.
fn loss_and_grads(c: T5Config) -> (f64, Vec<f32>, T5Model) {
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut m = T5Model::new(c, be.clone(), ParallelContext::single()).unwrap();
    let (loss, grads) = one_step(&mut m, &batch(0), be.as_ref());
    (loss, grads, m)
}

fn check(base: T5Config, what: &str, dtype: DType, loss_tol: f64, grad_tol: f64) {
    let (l32, g32, _) = loss_and_grads(base.clone());
    let mut c = base;
    c.params_dtype = dtype;
    let (lh, gh, m) = loss_and_grads(c);
    assert_param_dtypes(&m.params(), |_| dtype);
    assert_half_matches_fp32(&format!("{what} {dtype}"), &[("loss", lh, l32)], &gh, &g32, loss_tol, grad_tol);
}

// Tolerances as the GPT's and hybrid's: bf16 keeps 8 significant bits (2^-9 ≈ 2e-3 relative
// rounding per value), fp16 11 bits (about 8x tighter). The HF-style config (softmax scale 1,
// init std 0.3: sharp attention) amplifies the rounding: measured bf16 gradient error 7.1e-2,
// fp16 4.9e-3 (the mantissa ratio, spread evenly over all parameters, growing towards the
// input: rounding, not a wrong term), so its bf16 gradient bound is 1e-1.
#[test]
fn bf16_t5_matches_fp32_within_bf16_rounding() {
    check(common::config(), "megatron-style", DType::BF16, 1e-2, 6e-2);
    check(hf_style(), "hf-style", DType::BF16, 1e-2, 1e-1);
}

#[test]
fn fp16_t5_matches_fp32_within_fp16_rounding() {
    check(common::config(), "megatron-style", DType::F16, 2e-3, 1e-2);
    check(hf_style(), "hf-style", DType::F16, 2e-3, 1e-2);
}
