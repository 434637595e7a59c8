//! [`BertMlp`]: column-parallel `linear_fc1` → GeLU → row-parallel `linear_fc2` (names of
//! `megatron_transformer::Mlp`), with either Megatron's tanh GeLU (the backend op) or the exact
//! erf GeLU of Hugging Face BERT (`hidden_act = "gelu"`, needed to reproduce imported models).
//!
//! The erf GeLU has no backend op yet, so [`gelu_erf_forward`]/[`gelu_erf_backward`] compute it
//! on the host (a copy out and back; the CPU backend's tensors are host memory anyway), in f64
//! with `libm::erf`, rounded once to f32.

use anyhow::Result;
use megatron_core::{Backend, DType, DeviceTensor, HostBuffer, Param};
use megatron_transformer::linear::{LinearConfig, LinearLayer};
use megatron_transformer::step::{empty, ensure_buffer};
use megatron_transformer::{ModuleBuilder, ModuleScratch, SpecProvider, StepInfo, TransformerConfig};
use std::sync::Arc;

/// `x Φ(x)` with the exact normal CDF.
pub fn gelu_erf(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

/// `d/dx x Φ(x) = Φ(x) + x φ(x)`.
pub fn gelu_erf_grad(x: f64) -> f64 {
    let cdf = 0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2));
    let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    cdf + x * pdf
}

/// `out = gelu_erf(x)` elementwise (`out` keeps its dtype: a half `out` gets the fp32 result
/// rounded once).
pub fn gelu_erf_forward(bk: &dyn Backend, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
    let v: Vec<f32> = bk.to_host(x)?.to_f32_vec().iter().map(|&a| gelu_erf(a as f64) as f32).collect();
    store(bk, v, x.shape(), out)
}

/// `out = v` of `shape`, rounded into `out`'s dtype when it is a half type.
fn store(bk: &dyn Backend, v: Vec<f32>, shape: &[usize], out: &mut DeviceTensor) -> Result<()> {
    let t = bk.from_host(HostBuffer::F32(v), shape)?;
    if out.dtype() == DType::F32 {
        *out = t;
        return Ok(());
    }
    if out.shape() != shape {
        *out = bk.zeros(shape, out.dtype())?;
    }
    bk.cast(&t, out)
}

/// `d_x = d_out · gelu_erf'(x)` (overwritten).
pub fn gelu_erf_backward(
    bk: &dyn Backend,
    x: &DeviceTensor,
    d_out: &DeviceTensor,
    d_x: &mut DeviceTensor,
) -> Result<()> {
    let g = bk.to_host(d_out)?.to_f32_vec();
    let v: Vec<f32> = bk
        .to_host(x)?
        .to_f32_vec()
        .iter()
        .zip(&g)
        .map(|(&a, &g)| (g as f64 * gelu_erf_grad(a as f64)) as f32)
        .collect();
    store(bk, v, x.shape(), d_x)
}

/// GeLU by flavour: the backend's tanh approximation or the host erf one.
pub fn gelu_forward(bk: &dyn Backend, erf: bool, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
    if erf {
        gelu_erf_forward(bk, x, out)
    } else {
        bk.gelu_forward(x, out)
    }
}

pub fn gelu_backward(
    bk: &dyn Backend,
    erf: bool,
    x: &DeviceTensor,
    d_out: &DeviceTensor,
    d_x: &mut DeviceTensor,
) -> Result<()> {
    if erf {
        gelu_erf_backward(bk, x, d_out, d_x)
    } else {
        bk.gelu_backward(x, d_out, d_x)
    }
}

pub struct BertMlp {
    backend: Arc<dyn Backend>,
    pub linear_fc1: Box<dyn LinearLayer>,
    pub linear_fc2: Box<dyn LinearLayer>,
    gelu_erf: bool,
    ffn_local: usize,
    fc1_out: DeviceTensor, // (B, T, F/tp)
    act_out: DeviceTensor, // (B, T, F/tp)
}

impl BertMlp {
    pub fn new(
        b: &ModuleBuilder,
        provider: &dyn SpecProvider,
        prefix: &str,
        cfg: &TransformerConfig,
        gelu_erf: bool,
    ) -> Result<BertMlp> {
        let (h, f) = (cfg.hidden_size, cfg.ffn_hidden_size);
        let fc1 =
            LinearConfig { in_features: h, out_features: f, bias: true, init_std: cfg.init_method_std, out_chunks: 1 };
        let fc2 = LinearConfig {
            in_features: f,
            out_features: h,
            bias: true,
            init_std: cfg.output_init_std(),
            out_chunks: 1,
        };
        let backend = b.backend.clone();
        Ok(BertMlp {
            linear_fc1: provider.column_parallel_linear(b, &format!("{prefix}.linear_fc1"), fc1)?,
            linear_fc2: provider.row_parallel_linear(b, &format!("{prefix}.linear_fc2"), fc2)?,
            gelu_erf,
            ffn_local: f / b.tp_size(),
            fc1_out: empty(backend.as_ref())?,
            act_out: empty(backend.as_ref())?,
            backend,
        })
    }

    /// `out (B, T, C) = fc2(gelu(fc1(x)))`.
    pub fn forward(&mut self, x: &DeviceTensor, out: &mut DeviceTensor, step: &StepInfo) -> Result<()> {
        let bk = self.backend.clone();
        let (shape, dt) = ([step.batch, step.seq, self.ffn_local], x.dtype());
        ensure_buffer(bk.as_ref(), &mut self.fc1_out, &shape, dt)?;
        ensure_buffer(bk.as_ref(), &mut self.act_out, &shape, dt)?;
        self.linear_fc1.forward(x, &mut self.fc1_out)?;
        gelu_forward(bk.as_ref(), self.gelu_erf, &self.fc1_out, &mut self.act_out)?;
        self.linear_fc2.forward(&self.act_out, out)
    }

    /// Overwrites `d_x (B, T, C)`; accumulates parameter gradients.
    pub fn backward(
        &mut self,
        x: &DeviceTensor,
        d_out: &DeviceTensor,
        d_x: &mut DeviceTensor,
        scratch: &mut ModuleScratch,
    ) -> Result<()> {
        let bk = self.backend.clone();
        ensure_buffer(bk.as_ref(), &mut scratch.d_act, self.act_out.shape(), d_out.dtype())?;
        ensure_buffer(bk.as_ref(), &mut scratch.d_fc1, self.fc1_out.shape(), d_out.dtype())?;
        self.linear_fc2.backward(&self.act_out, d_out, Some(&mut scratch.d_act))?;
        gelu_backward(bk.as_ref(), self.gelu_erf, &self.fc1_out, &scratch.d_act, &mut scratch.d_fc1)?;
        self.linear_fc1.backward(x, &scratch.d_fc1, Some(d_x))
    }

    /// Frees what backward needs (full recomputation re-runs [`Self::forward`]).
    pub fn drop_saved(&mut self) -> Result<()> {
        let bk = self.backend.as_ref();
        (self.fc1_out, self.act_out) = (empty(bk)?, empty(bk)?);
        Ok(())
    }

    pub fn params(&self) -> Vec<&Param> {
        self.linear_fc1.params().into_iter().chain(self.linear_fc2.params()).collect()
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        self.linear_fc1.params_mut().into_iter().chain(self.linear_fc2.params_mut()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_gelu_matches_torch_and_its_derivative() {
        // torch.nn.functional.gelu(torch.tensor([-3., -1., -0.5, 0., 0.5, 1., 3.], dtype=float64))
        let want = [-0.0040496941, -0.1586552539, -0.1542687694, 0.0, 0.3457312306, 0.8413447461, 2.9959503059];
        for (x, w) in [-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0].iter().zip(want) {
            assert!((gelu_erf(*x) - w).abs() < 1e-9, "gelu({x}) = {} want {w}", gelu_erf(*x));
            let h = 1e-6;
            let fd = (gelu_erf(x + h) - gelu_erf(x - h)) / (2.0 * h);
            assert!((gelu_erf_grad(*x) - fd).abs() < 1e-8, "gelu'({x})");
        }
    }
}
