//! [`SharedExpert`]: Megatron's `SharedExpertMLP` (SPEC §4.12,
//! `--moe-shared-expert-intermediate-size`, `--moe-shared-expert-gate`): a dense MLP every
//! token goes through, added to the routed experts' output, optionally scaled per token by
//! `σ(x · gate_weightᵀ)` with `{prefix}.shared_experts.gate_weight` `(1, C)` (Qwen2-MoE's
//! `shared_expert_gate`). It reuses [`Experts`] with one expert whose per-row weight is the
//! gate (1.0 without one), so forward and backward are the routed experts' code.

use crate::experts::{ExpertSaved, Experts};
use crate::init::normal_param;
use anyhow::Result;
use megatron_core::{Backend, DType, DeviceTensor, HostBuffer, Param};
use std::sync::Arc;

pub struct SharedExpert {
    backend: Arc<dyn Backend>,
    hidden: usize,
    pub mlp: Experts,
    /// `(1, C)` when gated.
    pub gate: Option<Param>,
    saved: ExpertSaved,
    gate_prob: DeviceTensor, // (N): σ(x·g) of the last forward (empty without a gate)
}

impl SharedExpert {
    pub fn new(
        backend: Arc<dyn Backend>,
        prefix: &str,
        (hidden, ffn): (usize, usize),
        swiglu: bool,
        gated: bool,
        (std, out_std, seed): (f32, f32, u64),
    ) -> Result<SharedExpert> {
        let mlp = Experts::shared(backend.clone(), prefix, (hidden, ffn), swiglu, (std, out_std, seed))?;
        let gate = if gated {
            Some(normal_param(
                backend.as_ref(),
                &format!("{prefix}.shared_experts.gate_weight"),
                &[1, hidden],
                std,
                seed,
            )?)
        } else {
            None
        };
        let saved = ExpertSaved::empty(backend.as_ref())?;
        let gate_prob = backend.zeros(&[0], DType::F32)?;
        Ok(SharedExpert { backend, hidden, mlp, gate, saved, gate_prob })
    }

    /// `(N, C)` shared-expert output for rows `x (N, C)`.
    pub fn forward(&mut self, x: &[f32]) -> Result<Vec<f32>> {
        let c = self.hidden;
        let n = x.len() / c;
        let w: Vec<f32> = match &self.gate {
            Some(g) => {
                let g = g.value.host_f32()?;
                x.chunks(c).map(|r| 1.0 / (1.0 + (-r.iter().zip(g).map(|(a, b)| a * b).sum::<f32>()).exp())).collect()
            }
            None => vec![1.0; n],
        };
        self.gate_prob = if self.gate.is_some() {
            self.backend.from_host(HostBuffer::F32(w.clone()), &[n])?
        } else {
            self.backend.zeros(&[0], DType::F32)?
        };
        let xt = self.backend.from_host(HostBuffer::F32(x.to_vec()), &[n, c])?;
        self.mlp.forward(xt, w, &[n], &mut self.saved)
    }

    /// Adds the input gradient to `dx (N, C)` and accumulates the weights' gradients.
    pub fn backward(&mut self, x: &[f32], d_out: &[f32], dx: &mut [f32]) -> Result<()> {
        let c = self.hidden;
        let (d_in, d_w) = self.mlp.backward(&self.saved, d_out)?;
        dx.iter_mut().zip(&d_in).for_each(|(a, b)| *a += b);
        if let Some(g) = self.gate.as_mut() {
            // w = σ(l), l = x·g: dl = dw · w(1 − w); dg += Σ_t dl_t x_t; dx_t += dl_t g.
            let s = self.gate_prob.host_f32()?;
            let gv = g.value.host_f32()?.to_vec();
            let mut dg = vec![0.0f32; c];
            for (t, (&dwt, &st)) in d_w.iter().zip(s).enumerate() {
                let dl = dwt * st * (1.0 - st);
                for i in 0..c {
                    dg[i] += dl * x[t * c + i];
                    dx[t * c + i] += dl * gv[i];
                }
            }
            g.grad.host_f32_mut()?.iter_mut().zip(&dg).for_each(|(a, b)| *a += b);
        }
        Ok(())
    }

    pub fn params(&self) -> Vec<&Param> {
        let mut p = vec![&self.mlp.fc1[0], &self.mlp.fc2[0]];
        p.extend(self.gate.as_ref());
        p
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut p: Vec<&mut Param> = self.mlp.fc1.iter_mut().chain(self.mlp.fc2.iter_mut()).collect();
        p.extend(self.gate.as_mut());
        p
    }

    /// What backward needs (swapped per microbatch by pipeline schedules).
    pub fn tensors_mut(&mut self) -> Vec<&mut DeviceTensor> {
        let mut v = self.saved.tensors_mut();
        v.push(&mut self.gate_prob);
        v
    }
}
