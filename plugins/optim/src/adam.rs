//! The `adam` optimizer: Megatron's default, AdamW semantics (decoupled weight decay, bias
//! correction) through the backend's fused [`Backend::adam_step`] (SPEC §6.5).

use crate::state_tensors::{self, StateMap};
use anyhow::{bail, Result};
use megatron_core::{AdamStep, Backend, Optimizer, OptimizerState, Param};
use serde::{Deserialize, Serialize};

/// Names of the per-parameter states, in the order [`StateMap`] holds them.
const KINDS: [&str; 2] = ["exp_avg", "exp_avg_sq"];

/// Config of the `adam` plugin; the defaults are Megatron's.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdamConfig {
    /// `--adam-beta1`.
    #[serde(default = "default_beta1")]
    pub beta1: f64,
    /// `--adam-beta2`.
    #[serde(default = "default_beta2")]
    pub beta2: f64,
    /// `--adam-eps`.
    #[serde(default = "default_eps")]
    pub eps: f64,
}

fn default_beta1() -> f64 {
    0.9
}
fn default_beta2() -> f64 {
    0.999
}
fn default_eps() -> f64 {
    1e-8
}

impl Default for AdamConfig {
    fn default() -> AdamConfig {
        AdamConfig { beta1: default_beta1(), beta2: default_beta2(), eps: default_eps() }
    }
}

/// AdamW with fp32 `exp_avg` / `exp_avg_sq`, created on a parameter's first step.
#[derive(Debug)]
pub struct Adam {
    config: AdamConfig,
    steps: u64,
    states: StateMap,
}

impl Adam {
    pub fn new(config: AdamConfig) -> Result<Adam> {
        for (v, flag) in [(config.beta1, "--adam-beta1"), (config.beta2, "--adam-beta2")] {
            if !(0.0..1.0).contains(&v) {
                bail!("{flag} {v} must be in [0, 1)");
            }
        }
        if !(config.eps > 0.0 && config.eps.is_finite()) {
            bail!("--adam-eps {} must be a positive number", config.eps);
        }
        Ok(Adam { config, steps: 0, states: StateMap::new() })
    }

    pub fn config(&self) -> &AdamConfig {
        &self.config
    }
}

impl Optimizer for Adam {
    fn name(&self) -> &str {
        "adam"
    }

    fn step(&mut self, params: &mut [&mut Param], lr: f64, weight_decay: f64, backend: &dyn Backend) -> Result<()> {
        self.steps += 1;
        for p in params.iter_mut() {
            let p: &mut Param = p;
            let (state, _) = state_tensors::get_or_create(&mut self.states, p, &KINDS, backend)?;
            let [exp_avg, exp_avg_sq] = state else { unreachable!("get_or_create returns one tensor per kind") };
            let wd = state_tensors::decay_for(p, weight_decay);
            let spec = AdamStep {
                lr: lr as f32,
                beta1: self.config.beta1 as f32,
                beta2: self.config.beta2 as f32,
                eps: self.config.eps as f32,
                weight_decay: wd as f32,
                step: self.steps,
            };
            backend.adam_step(&mut p.value, &p.grad, exp_avg, exp_avg_sq, spec)?;
        }
        Ok(())
    }

    fn steps(&self) -> u64 {
        self.steps
    }

    fn state(&self, backend: &dyn Backend) -> Result<OptimizerState> {
        state_tensors::save(&self.states, &KINDS, self.steps, backend)
    }

    fn load_state(&mut self, state: OptimizerState, params: &[&Param], backend: &dyn Backend) -> Result<()> {
        let (steps, states) = state_tensors::load(state, &KINDS, "adam", params, backend)?;
        self.steps = steps;
        self.states = states;
        Ok(())
    }
}
