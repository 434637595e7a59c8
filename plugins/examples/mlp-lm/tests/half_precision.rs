//! bf16/fp16 `swiglu-mlp-lm` (`params_dtype`, the driver's `--bf16`/`--fp16`): half parameters
//! and activations (logits included), fp32 norm and cross-entropy statistics, fp32 gradient
//! buffers. The same model in fp32 is the reference: the loss and every gradient of one
//! microbatch agree within the half type's rounding (tolerances below).

use megatron_core::{Backend, Batch, DType, Mode, Model, ParallelContext};
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
    m.zero_grad().unwrap();
    let r = m.forward(&batch(), Mode::Train).unwrap();
    m.backward(1.0 / r.num_tokens as f32).unwrap();
    let g = m.params().iter().flat_map(|p| be.to_host(&p.grad).unwrap().to_f32_vec()).collect();
    (r.loss_sum / r.num_tokens, g, m)
}

/// `|a - b| / |b|` in the L2 norm.
fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (d / n).sqrt()
}

fn check(dtype: DType, loss_tol: f64, grad_tol: f64) {
    let (l32, g32, m32) = loss_and_grads(DType::F32);
    for p in m32.params() {
        assert_eq!(p.value.dtype(), DType::F32, "{}: the default stays fp32", p.name);
    }
    let (lh, gh, m) = loss_and_grads(dtype);
    for p in m.params() {
        assert_eq!(p.value.dtype(), dtype, "{}", p.name);
        assert_eq!(p.grad.dtype(), DType::F32, "{}: gradients accumulate in fp32", p.name);
    }
    let rel = ((lh - l32) / l32).abs();
    eprintln!("{dtype}: loss {lh:.6} vs {l32:.6} (rel {rel:.2e})");
    assert!(rel < loss_tol, "{dtype}: loss {lh} vs fp32 {l32} (rel {rel:.2e} >= {loss_tol:.0e})");
    let e = rel_l2(&gh, &g32);
    eprintln!("{dtype}: gradient rel. L2 error {e:.3e}");
    assert!(e < grad_tol, "{dtype}: gradient rel. L2 error {e:.3e} >= {grad_tol:.0e}");
    assert!(e > 0.0, "{dtype}: gradients identical to fp32: the half path did not run");
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
