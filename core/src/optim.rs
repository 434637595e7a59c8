//! [`Optimizer`] and [`LrSchedule`] traits (SPEC §6.3–6.6).

use crate::{Backend, DeviceTensor, Param, Result};

/// Optimizer state for checkpoints: scalars as JSON, tensors keyed `"{param}.{state}"`
/// (per parameter, never per bucket, so any parallel layout can load it).
#[derive(Debug, Default)]
pub struct OptimizerState {
    pub scalars: serde_json::Value,
    pub tensors: Vec<(String, DeviceTensor)>,
}

pub trait Optimizer: Send {
    fn name(&self) -> &str;
    /// One update of every parameter from its (already reduced and clipped) gradient.
    /// `weight_decay` is the scheduled value; params with `no_weight_decay` use 0.
    fn step(&mut self, params: &mut [&mut Param], lr: f64, weight_decay: f64, backend: &dyn Backend) -> Result<()>;
    /// Number of steps taken.
    fn steps(&self) -> u64;
    fn state(&self, backend: &dyn Backend) -> Result<OptimizerState>;
    /// Restores a [`Optimizer::state`]; errors name the missing or mismatched tensor.
    fn load_state(&mut self, state: OptimizerState, params: &[&Param], backend: &dyn Backend) -> Result<()>;
}

/// Learning-rate and weight-decay schedule, counted in samples.
pub trait LrSchedule: Send {
    fn name(&self) -> &str;
    /// LR for the current step count.
    fn lr(&self) -> f64;
    /// Weight decay for the current step count.
    fn weight_decay(&self) -> f64;
    /// Advances by `increment` samples (after each successful step).
    fn step(&mut self, increment: u64);
    fn num_steps(&self) -> u64;
    fn state_dict(&self) -> serde_json::Value;
    /// Restores `num_steps`; stored hyper-parameters must match the configured ones
    /// unless `override_config` (then the configured ones win).
    fn load_state_dict(&mut self, state: &serde_json::Value, override_config: bool) -> Result<()>;
}
