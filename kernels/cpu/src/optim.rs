//! Fused optimizer updates (AdamW, SGD with momentum), one parallel vectorised pass over the
//! parameter, gradient and state buffers.

use crate::check::{f32s, f32s_mut, same_numel};
use crate::elementwise::CHUNK;
use crate::simd_kernel;
use megatron_core::anyhow::bail;
use megatron_core::{AdamStep, DeviceTensor, Result};
use rayon::prelude::*;

pub(crate) fn adam_step(
    param: &mut DeviceTensor,
    grad: &DeviceTensor,
    exp_avg: &mut DeviceTensor,
    exp_avg_sq: &mut DeviceTensor,
    step: AdamStep,
) -> Result<()> {
    const OP: &str = "adam_step";
    same_numel(OP, "param", param, "grad", grad)?;
    same_numel(OP, "param", param, "exp_avg", exp_avg)?;
    same_numel(OP, "param", param, "exp_avg_sq", exp_avg_sq)?;
    if step.step == 0 {
        bail!("cpu backend: `adam_step` needs a 1-based step count, got step=0");
    }
    let AdamStep { lr, beta1, beta2, eps, weight_decay, step: t } = step;
    // Bias corrections in f64: 1-β^t loses digits in f32 for β2 = 0.999 and small t.
    let bc1 = (1.0 - (beta1 as f64).powf(t as f64)) as f32;
    let bc2 = (1.0 - (beta2 as f64).powf(t as f64)) as f32;
    let (step_size, inv_sqrt_bc2) = (lr / bc1, 1.0 / bc2.sqrt());
    let decay = 1.0 - lr * weight_decay;
    let g = f32s(OP, "grad", grad)?;
    let p = f32s_mut(OP, "param", param)?;
    let m = f32s_mut(OP, "exp_avg", exp_avg)?;
    let v = f32s_mut(OP, "exp_avg_sq", exp_avg_sq)?;
    p.par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK))
        .zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)))
        .for_each(|((p, g), (m, v))| adam_kernel(p, g, m, v, [decay, beta1, beta2, step_size, inv_sqrt_bc2, eps]));
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn sgd_step(
    param: &mut DeviceTensor,
    grad: &DeviceTensor,
    momentum_buf: &mut DeviceTensor,
    lr: f32,
    momentum: f32,
    weight_decay: f32,
    first_step: bool,
) -> Result<()> {
    const OP: &str = "sgd_step";
    same_numel(OP, "param", param, "grad", grad)?;
    same_numel(OP, "param", param, "momentum_buf", momentum_buf)?;
    let g = f32s(OP, "grad", grad)?;
    let p = f32s_mut(OP, "param", param)?;
    let b = f32s_mut(OP, "momentum_buf", momentum_buf)?;
    p.par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK))
        .zip(b.par_chunks_mut(CHUNK))
        .for_each(|((p, g), b)| sgd_kernel(p, g, b, lr, momentum, weight_decay, first_step));
    Ok(())
}

simd_kernel! {
    /// `k = [decay, beta1, beta2, lr/bc1, 1/sqrt(bc2), eps]`.
    fn adam_kernel(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], k: [f32; 6]) {
        let [decay, beta1, beta2, step_size, inv_sqrt_bc2, eps] = k;
        for ((p, &g), (m, v)) in p.iter_mut().zip(g).zip(m.iter_mut().zip(v.iter_mut())) {
            *p *= decay;
            *m = beta1 * *m + (1.0 - beta1) * g;
            *v = beta2 * *v + (1.0 - beta2) * g * g;
            *p -= step_size * *m / (v.sqrt() * inv_sqrt_bc2 + eps);
        }
    }
}

simd_kernel! {
    /// On the first step the buffer is set to `g'` without reading its old contents.
    fn sgd_kernel(p: &mut [f32], g: &[f32], b: &mut [f32], lr: f32, momentum: f32, weight_decay: f32, first: bool) {
        for ((p, &g), b) in p.iter_mut().zip(g).zip(b.iter_mut()) {
            let gd = g + weight_decay * *p;
            *b = if first { gd } else { momentum * *b + gd };
            *p -= lr * *b;
        }
    }
}
