//! [`ForwardPreHook`]: Megatron's forward pre-hook of `--overlap-param-gather` (SPEC §5.7).
//!
//! With the distributed optimizer the updated parameters come back from an all-gather over the
//! data-parallel group. With overlap, the optimizer step only *starts* those all-gathers (per
//! bucket, in the background) and the next forward waits, module by module, for the bucket(s)
//! holding the parameters of the module it is about to run, so the gathers of later layers
//! overlap with the compute of earlier ones.
//!
//! A model that supports it ([`crate::Model::set_forward_pre_hook`] returns `true`) calls
//! [`ForwardPreHook::before_forward`] with each module's parameters right before that module's
//! forward (embedding, every layer, final norm, output layer). The driver calls
//! [`ForwardPreHook::finish`] before anything else reads the parameters (evaluation, checkpoint
//! saving, the end of training) and before every forward of a model that does not support the
//! hook.

use crate::{Param, Result};
use anyhow::anyhow;
use std::sync::{Arc, Mutex};

/// Writes parameters whose new values are still in flight (see the module doc).
pub trait ForwardPreHook: Send {
    /// Waits for the pending values of `params` (only those; other parameters stay pending)
    /// and writes them. Parameters with nothing pending are left alone: this is called on
    /// every forward of every microbatch and must be cheap then.
    fn before_forward(&mut self, params: &mut [&mut Param]) -> Result<()>;
    /// Waits for everything in flight and writes every pending value into `params` (all of
    /// the model's parameters).
    fn finish(&mut self, params: &mut [&mut Param]) -> Result<()>;
}

/// A hook shared by the optimizer that starts the gathers and the model that waits for them.
pub type SharedForwardPreHook = Arc<Mutex<dyn ForwardPreHook>>;

/// Runs `hook` (if any) on `params`: the call a model makes before a module's forward.
pub fn run_forward_pre_hook(hook: Option<&SharedForwardPreHook>, mut params: Vec<&mut Param>) -> Result<()> {
    match hook {
        None => Ok(()),
        Some(h) => h
            .lock()
            .map_err(|_| anyhow!("the parameter all-gather hook (--overlap-param-gather) was poisoned by a panic"))?
            .before_forward(&mut params),
    }
}
