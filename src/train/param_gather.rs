//! `--overlap-param-gather` in the driver (SPEC §5.7): the distributed optimizer's step only
//! starts the parameter all-gathers, the model's forward pre-hooks wait for them module by
//! module, and everything else that reads the parameters (evaluation, checkpoint save and load,
//! the end of training) first waits for all of them here.

use super::Trainer;
use anyhow::{anyhow, Result};
use megatron_core::SharedForwardPreHook;

/// The hook shared by the distributed optimizer and the model.
pub struct OverlapParamGather {
    pub hook: SharedForwardPreHook,
    /// The model calls the hook before each module ([`megatron_core::Model::set_forward_pre_hook`]
    /// returned `true`); otherwise every forward waits for all buckets first.
    pub per_module: bool,
}

impl Trainer {
    /// Waits for every parameter all-gather still in flight and writes the parameters.
    pub fn finish_param_gather(&mut self) -> Result<()> {
        let Some(g) = &self.param_gather else { return Ok(()) };
        let mut params = self.model.params_mut();
        g.hook.lock().map_err(|_| anyhow!("the parameter all-gather hook was poisoned by a panic"))?.finish(&mut params)
    }

    /// Before a step's forwards: a model without per-module hooks waits for everything.
    pub(super) fn param_gather_before_forward(&mut self) -> Result<()> {
        match &self.param_gather {
            Some(g) if !g.per_module => self.finish_param_gather(),
            _ => Ok(()),
        }
    }
}
