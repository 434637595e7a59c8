//! [`ElementwiseOps`]: in-place and elementwise updates and the reductions of gradient norms
//! and overflow checks.

use crate::{DeviceTensor, Result};

/// Elementwise ops and reductions.
pub trait ElementwiseOps {
    fn fill(&self, t: &mut DeviceTensor, value: f32) -> Result<()>;
    fn scale(&self, t: &mut DeviceTensor, s: f32) -> Result<()>;
    /// `a += alpha * b`.
    fn axpy(&self, a: &mut DeviceTensor, alpha: f32, b: &DeviceTensor) -> Result<()>;
    /// `out = a + b` (the residual add).
    fn add(&self, a: &DeviceTensor, b: &DeviceTensor, out: &mut DeviceTensor) -> Result<()>;
    /// `out[C] += sum over rows of x[N, C]` (bias gradients).
    fn sum_rows(&self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()>;
    /// `Σ x²` accumulated in f64 (gradient norms).
    fn sum_squares(&self, x: &DeviceTensor) -> Result<f64>;
    /// `max |x|` and whether any element is inf/NaN.
    fn abs_max(&self, x: &DeviceTensor) -> Result<(f32, bool)>;
}
