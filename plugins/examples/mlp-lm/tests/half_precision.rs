//! bf16/fp16 `swiglu-mlp-lm` (`params_dtype`, the driver's `--bf16`/`--fp16`): half parameters
//! and activations (logits included), fp32 norm and cross-entropy statistics, fp32 gradient
//! buffers. The same model in fp32 is the reference: the loss and every gradient of one
//! microbatch agree within the half type's rounding (tolerances below).

use megatron_core::half_parity::{assert_half_matches_fp32, assert_param_dtypes, one_step};
use megatron_core::{Backend, Batch, DType, Model, ParallelContext};
use megatron_cpu::CpuBackend;
use megatron_example_mlp_lm::{MlpLm, MlpLmConfig};
use std::sync::Arc;

const B: usize = 2;
const S: usize = 8;
const VOCAB: usize = 50;

fn config(dtype: DType) -> MlpLmConfig {
    let mut c = MlpLmConfig::new(2, 32, VOCAB);
    c.ffn_hidden_size = Some(48);
    c.make_vocab_size_divisible_by = 8;
    c.init_method_std = 0.2; // O(1)-ish activations, so every path carries gradient
    c.params_dtype = dtype;
    c
}

fn batch() -> Batch {
    let n = B * S;
    let tokens: Vec<i32> = (0..n).map(|i| ((i * 7 + 3) % VOCAB) as i32).collect();
    let labels: Vec<i32> = (0..n).map(|i| ((i * 11 + 5) % VOCAB) as i32).collect();
    let loss_mask = (0..n).map(|i| if i % 5 == 4 { 0.0 } else { 1.0 }).collect();
    Batch { tokens, labels, loss_mask, micro_batch_size: B, seq_length: S, seed: 0 }
}

/// Loss, concatenated gradients and the model after one microbatch.
fn loss_and_grads(dtype: DType) -> (f64, Vec<f32>, MlpLm) {
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::with_threads(1).unwrap());
    let mut m = MlpLm::new(config(dtype), be.clone(), &ParallelContext::single()).unwrap();
    let (loss, grads) = one_step(&mut m, &batch(), be.as_ref());
    (loss, grads, m)
}

fn check(dtype: DType, loss_tol: f64, grad_tol: f64) {
    let (l32, g32, m32) = loss_and_grads(DType::F32);
    for p in m32.params() {
        assert_eq!(p.value.dtype(), DType::F32, "{}: the default stays fp32", p.name);
    }
    let (lh, gh, m) = loss_and_grads(dtype);
    assert_param_dtypes(&m.params(), |_| dtype);
    assert_half_matches_fp32(&dtype.to_string(), &[("loss", lh, l32)], &gh, &g32, loss_tol, grad_tol);
}

// Tolerances as the GPT's and T5's: bf16 keeps 8 significant bits (2^-9 ≈ 2e-3 relative
// rounding per value), fp16 11 bits (about 8x tighter).
#[test]
fn bf16_mlp_lm_matches_fp32_within_bf16_rounding() {
    check(DType::BF16, 1e-2, 6e-2);
}

#[test]
fn fp16_mlp_lm_matches_fp32_within_fp16_rounding() {
    check(DType::F16, 2e-3, 1e-2);
}
