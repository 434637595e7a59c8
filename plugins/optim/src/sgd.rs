//! The `sgd` optimizer (`--optimizer sgd`): torch.optim.SGD with momentum and coupled weight
//! decay through [`Backend::sgd_step`] (SPEC §6.5).

use crate::state_tensors::{self, StateMap};
use anyhow::{bail, Result};
use megatron_core::{Backend, Optimizer, OptimizerState, Param};
use serde::{Deserialize, Serialize};

const KINDS: [&str; 1] = ["momentum_buffer"];

/// Config of the `sgd` plugin.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SgdConfig {
    /// `--sgd-momentum`.
    #[serde(default = "default_momentum")]
    pub momentum: f64,
}

fn default_momentum() -> f64 {
    0.9
}

impl Default for SgdConfig {
    fn default() -> SgdConfig {
        SgdConfig { momentum: default_momentum() }
    }
}

/// SGD with an fp32 momentum buffer per parameter, created on its first step.
#[derive(Debug)]
pub struct Sgd {
    config: SgdConfig,
    steps: u64,
    states: StateMap,
}

impl Sgd {
    pub fn new(config: SgdConfig) -> Result<Sgd> {
        if !(0.0..=1.0).contains(&config.momentum) {
            bail!("--sgd-momentum {} must be in [0, 1]", config.momentum);
        }
        Ok(Sgd { config, steps: 0, states: StateMap::new() })
    }

    pub fn config(&self) -> &SgdConfig {
        &self.config
    }
}

impl Optimizer for Sgd {
    fn name(&self) -> &str {
        "sgd"
    }

    fn step(&mut self, params: &mut [&mut Param], lr: f64, weight_decay: f64, backend: &dyn Backend) -> Result<()> {
        self.steps += 1;
        for p in params.iter_mut() {
            let p: &mut Param = p;
            // torch starts the buffer at the first gradient rather than decaying a zero one.
            let (state, first_step) = state_tensors::get_or_create(&mut self.states, p, &KINDS, backend)?;
            let [buf] = state else { unreachable!("get_or_create returns one tensor per kind") };
            let wd = state_tensors::decay_for(p, weight_decay);
            backend.sgd_step(
                &mut p.value,
                &p.grad,
                buf,
                lr as f32,
                self.config.momentum as f32,
                wd as f32,
                first_step,
            )?;
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
        let (steps, states) = state_tensors::load(state, &KINDS, "sgd", params, backend)?;
        self.steps = steps;
        self.states = states;
        Ok(())
    }
}
