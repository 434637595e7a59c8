//! Finite-difference gradient checking, shared by the tests of this crate and of the model
//! crates: perturb single parameter elements by `±eps`, rerun a loss closure and compare the
//! central difference with the gradient backward accumulated.

use anyhow::Result;
use megatron_core::{Backend, DeviceTensor, HostBuffer, Param};

/// One checked element.
#[derive(Clone, Debug)]
pub struct GradSample {
    pub param: String,
    pub index: usize,
    pub analytic: f64,
    pub numeric: f64,
    /// `|analytic - numeric| / max(|analytic|, |numeric|, floor)`.
    pub rel_err: f64,
}

/// The tensor's elements as f32 on the host.
pub fn read(backend: &dyn Backend, t: &DeviceTensor) -> Result<Vec<f32>> {
    Ok(backend.to_host(t)?.to_f32_vec())
}

/// Replaces `t` by a tensor of the same shape holding `data`.
pub fn write(backend: &dyn Backend, t: &mut DeviceTensor, data: Vec<f32>) -> Result<()> {
    let shape = t.shape().to_vec();
    *t = backend.from_host(HostBuffer::F32(data), &shape)?;
    Ok(())
}

/// `count` indices spread over `0..len` (first, last and evenly in between).
pub fn spread_indices(len: usize, count: usize) -> Vec<usize> {
    if len == 0 {
        return vec![];
    }
    let count = count.min(len).max(1);
    let mut v: Vec<usize> = (0..count).map(|i| (i * (len - 1)) / (count - 1).max(1)).collect();
    v.dedup();
    v
}

/// Central differences of `loss` w.r.t. `per_param` elements of every parameter whose name
/// passes `select`. Gradients must already hold the analytic values (backward run once from
/// zeroed grads); `floor` keeps near-zero gradients from inflating the relative error.
#[allow(clippy::too_many_arguments)]
pub fn check_params<M: ?Sized>(
    model: &mut M,
    backend: &dyn Backend,
    params: fn(&mut M) -> Vec<&mut Param>,
    select: &dyn Fn(&str) -> bool,
    loss: &mut dyn FnMut(&mut M) -> Result<f64>,
    per_param: usize,
    eps: f32,
    floor: f64,
) -> Result<Vec<GradSample>> {
    let names: Vec<String> = params(model).iter().map(|p| p.name.clone()).filter(|n| select(n)).collect();
    let mut out = Vec::new();
    for name in names {
        let find = |m: &mut M| -> usize {
            params(m).iter().position(|p| p.name == name).unwrap_or_else(|| unreachable!("listed above"))
        };
        let k = find(model);
        let (values, grads) = {
            let ps = params(model);
            (read(backend, &ps[k].value)?, read(backend, &ps[k].grad)?)
        };
        for i in spread_indices(values.len(), per_param) {
            let mut eval = |delta: f32, m: &mut M| -> Result<f64> {
                let mut v = values.clone();
                v[i] += delta;
                write(backend, &mut params(m)[k].value, v)?;
                loss(m)
            };
            let plus = eval(eps, model)?;
            let minus = eval(-eps, model)?;
            write(backend, &mut params(model)[k].value, values.clone())?;
            let numeric = (plus - minus) / (2.0 * eps as f64);
            let analytic = grads[i] as f64;
            let rel_err = (analytic - numeric).abs() / analytic.abs().max(numeric.abs()).max(floor);
            out.push(GradSample { param: name.clone(), index: i, analytic, numeric, rel_err });
        }
    }
    Ok(out)
}

/// The sample with the largest relative error.
pub fn worst(samples: &[GradSample]) -> Option<&GradSample> {
    samples.iter().max_by(|a, b| a.rel_err.total_cmp(&b.rel_err))
}
