//! Test support for the models' bf16/fp16-vs-fp32 one-step tests (SPEC §6.7): one training
//! microbatch of the same model in a half type and in fp32, then the losses compared relatively
//! and the gradients in the relative L2 norm, each within the half type's rounding. The models'
//! tests keep their own configs, batches and tolerances; the comparison is this one.

use crate::{Backend, Batch, DType, Mode, Model, Param};

/// `|a - b| / |b|` in the L2 norm.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (d / n).sqrt()
}

/// One training microbatch from zeroed gradients with `d loss / d per_token_loss =
/// 1 / num_tokens`: the mean loss and every parameter's gradient, concatenated in `params()` order.
pub fn one_step(model: &mut dyn Model, batch: &Batch, backend: &dyn Backend) -> (f64, Vec<f32>) {
    model.zero_grad().unwrap();
    let r = model.forward(batch, Mode::Train).unwrap();
    model.backward(1.0 / r.num_tokens as f32).unwrap();
    (r.loss_sum / r.num_tokens, concat_grads(&model.params(), backend))
}

/// Every gradient of `params` on the host, concatenated.
pub fn concat_grads(params: &[&Param], backend: &dyn Backend) -> Vec<f32> {
    params.iter().flat_map(|p| backend.to_host(&p.grad).unwrap().to_f32_vec()).collect()
}

/// Each parameter's value has the dtype `value_dtype` gives for it; every gradient is fp32.
pub fn assert_param_dtypes(params: &[&Param], value_dtype: impl Fn(&Param) -> DType) {
    for p in params {
        assert_eq!(p.value.dtype(), value_dtype(p), "{}", p.name);
        assert_eq!(p.grad.dtype(), DType::F32, "{}: gradients accumulate in fp32", p.name);
    }
}

/// Asserts a half-precision run against its fp32 reference: every `(name, half, fp32)` loss within
/// `loss_tol` relative, the gradients within `grad_tol` in the relative L2 norm and not identical
/// to fp32 (identical would mean the half path did not run). `what` prefixes every message.
pub fn assert_half_matches_fp32(
    what: &str,
    losses: &[(&str, f64, f64)],
    half_grads: &[f32],
    fp32_grads: &[f32],
    loss_tol: f64,
    grad_tol: f64,
) {
    for &(name, h, f) in losses {
        let rel = ((h - f) / f).abs();
        eprintln!("{what}: {name} {h:.6} vs {f:.6} (rel {rel:.2e})");
        assert!(rel < loss_tol, "{what}: {name} {h} vs fp32 {f} (rel {rel:.2e} >= {loss_tol:.0e})");
    }
    let e = rel_l2(half_grads, fp32_grads);
    eprintln!("{what}: gradient rel. L2 error {e:.3e}");
    assert!(e < grad_tol, "{what}: gradient rel. L2 error {e:.3e} >= {grad_tol:.0e}");
    assert!(e > 0.0, "{what}: gradients identical to fp32: the half path did not run");
}

#[cfg(test)]
mod tests {
    use super::{assert_half_matches_fp32, rel_l2};

    #[test]
    fn rel_l2_is_the_relative_l2_error() {
        assert_eq!(rel_l2(&[3.0, 4.0], &[3.0, 4.0]), 0.0);
        assert!((rel_l2(&[3.0, 5.0], &[3.0, 4.0]) - 0.2).abs() < 1e-12);
    }

    #[test]
    #[should_panic(expected = "gradient rel. L2 error")]
    fn a_gradient_error_over_the_tolerance_fails() {
        assert_half_matches_fp32("t", &[("loss", 1.0, 1.0)], &[3.0, 5.0], &[3.0, 4.0], 1e-2, 1e-1);
    }

    #[test]
    #[should_panic(expected = "loss 1.1 vs fp32 1")]
    fn a_loss_error_over_the_tolerance_fails() {
        assert_half_matches_fp32("t", &[("loss", 1.1, 1.0)], &[3.0, 4.1], &[3.0, 4.0], 1e-2, 1e-1);
    }

    #[test]
    #[should_panic(expected = "the half path did not run")]
    fn gradients_identical_to_fp32_fail() {
        assert_half_matches_fp32("t", &[("loss", 1.0, 1.0)], &[3.0, 4.0], &[3.0, 4.0], 1e-2, 1e-1);
    }
}
