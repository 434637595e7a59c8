//! `impl ElementwiseOps for CpuBackend`: elementwise updates and reductions.

use crate::widen::{input, Out};
use crate::{elementwise, CpuBackend};
use megatron_core::{DeviceTensor, ElementwiseOps, Result};

impl ElementwiseOps for CpuBackend {
    fn fill(&self, t: &mut DeviceTensor, value: f32) -> Result<()> {
        self.run(|| elementwise::fill(t, value))
    }
    fn scale(&self, t: &mut DeviceTensor, s: f32) -> Result<()> {
        self.run(|| elementwise::scale(t, s))
    }
    fn axpy(&self, a: &mut DeviceTensor, alpha: f32, b: &DeviceTensor) -> Result<()> {
        self.run(|| elementwise::axpy(a, alpha, b))
    }
    fn add(&self, a: &DeviceTensor, b: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        self.run(|| elementwise::add(a, b, out))
    }
    fn sum_rows(&self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        self.run(|| {
            let mut o = Out::new(out, true)?;
            elementwise::sum_rows(x, o.t())?;
            o.finish()
        })
    }
    fn sum_squares(&self, x: &DeviceTensor) -> Result<f64> {
        self.run(|| elementwise::sum_squares(&*input(x)?))
    }
    fn abs_max(&self, x: &DeviceTensor) -> Result<(f32, bool)> {
        self.run(|| elementwise::abs_max(&*input(x)?))
    }
}
