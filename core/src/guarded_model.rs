//! [`GuardedModel`]: the host's wrapper around a [`Model`] built by a dynamically loaded plugin,
//! running every method under the library's `catch_unwind` so a panic in plugin code becomes
//! an error naming the plugin instead of aborting the process.
//!
//! It is a [`ModelWrapper`] overriding every method with a guarded call; a [`Model`] method added
//! later and not guarded here still reaches the plugin's model (the wrapper's forwarding default),
//! only without the guard.

use crate::plugin_loader::PanicGuard;
use crate::{Batch, DeviceTensor, GradsReadyHook, LossReport, Mode, Model, ModelWrapper, Param, Result, StageOutput};
use anyhow::anyhow;

pub struct GuardedModel {
    inner: Box<dyn Model>,
    guard: PanicGuard,
    /// `model `name` from `library path``, for messages.
    label: String,
}

impl GuardedModel {
    pub fn new(inner: Box<dyn Model>, guard: PanicGuard, label: String) -> GuardedModel {
        GuardedModel { inner, guard, label }
    }

    /// Runs a fallible method; a panic becomes an error naming the plugin and the method.
    fn fallible<R>(&mut self, method: &str, f: impl FnOnce(&mut dyn Model) -> Result<R>) -> Result<R> {
        let (guard, inner) = (self.guard, &mut self.inner);
        guard.call(|| f(inner.as_mut())).map_err(|m| anyhow!("plugin {} panicked in {method}: {m}", self.label))?
    }

    /// Methods without a `Result` re-raise a plugin panic as a host panic (which the host can
    /// catch, unlike the library's).
    fn infallible<'a, R>(&'a self, method: &str, f: impl FnOnce(&'a dyn Model) -> R) -> R {
        let inner = self.inner.as_ref();
        match self.guard.call(|| f(inner)) {
            Ok(r) => r,
            Err(m) => panic!("plugin {} panicked in {method}: {m}", self.label),
        }
    }
}

impl ModelWrapper for GuardedModel {
    fn wrapped(&self) -> &dyn Model {
        self.inner.as_ref()
    }

    fn wrapped_mut(&mut self) -> &mut dyn Model {
        self.inner.as_mut()
    }

    fn name(&self) -> &str {
        self.infallible("name", |m| m.name())
    }

    fn forward(&mut self, batch: &Batch, mode: Mode) -> Result<LossReport> {
        self.fallible("forward", |m| m.forward(batch, mode))
    }

    fn backward(&mut self, grad_scale: f32) -> Result<()> {
        self.fallible("backward", |m| m.backward(grad_scale))
    }

    fn logits(&mut self, tokens: &[i32], micro_batch_size: usize, seq_length: usize) -> Result<DeviceTensor> {
        self.fallible("logits", |m| m.logits(tokens, micro_batch_size, seq_length))
    }

    fn params(&self) -> Vec<&Param> {
        self.infallible("params", |m| m.params())
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        let (guard, inner) = (self.guard, &mut self.inner);
        match guard.call(|| inner.params_mut()) {
            Ok(r) => r,
            Err(m) => panic!("plugin {} panicked in params_mut: {m}", self.label),
        }
    }

    fn buffers(&self) -> Vec<&Param> {
        self.infallible("buffers", |m| m.buffers())
    }

    fn buffers_mut(&mut self) -> Vec<&mut Param> {
        let (guard, inner) = (self.guard, &mut self.inner);
        match guard.call(|| inner.buffers_mut()) {
            Ok(r) => r,
            Err(m) => panic!("plugin {} panicked in buffers_mut: {m}", self.label),
        }
    }

    fn zero_grad(&mut self) -> Result<()> {
        self.fallible("zero_grad", |m| m.zero_grad())
    }

    fn flops_per_iteration(&self, samples: usize) -> f64 {
        self.infallible("flops_per_iteration", |m| m.flops_per_iteration(samples))
    }

    // The pipeline-stage methods are forwarded too: the trait's defaults would otherwise
    // replace a plugin's own implementation.
    fn is_first_stage(&self) -> bool {
        self.infallible("is_first_stage", |m| m.is_first_stage())
    }

    fn is_last_stage(&self) -> bool {
        self.infallible("is_last_stage", |m| m.is_last_stage())
    }

    fn stage_buffer(&self, batch: &Batch) -> Result<DeviceTensor> {
        self.infallible("stage_buffer", |m| m.stage_buffer(batch))
    }

    fn forward_stage(
        &mut self,
        microbatch: usize,
        batch: &Batch,
        input: Option<DeviceTensor>,
        mode: Mode,
    ) -> Result<StageOutput> {
        self.fallible("forward_stage", |m| m.forward_stage(microbatch, batch, input, mode))
    }

    fn backward_stage(
        &mut self,
        microbatch: usize,
        grad_output: Option<DeviceTensor>,
        grad_scale: f32,
        on_grads_ready: GradsReadyHook,
    ) -> Result<Option<DeviceTensor>> {
        self.fallible("backward_stage", |m| m.backward_stage(microbatch, grad_output, grad_scale, on_grads_ready))
    }

    fn finalize_grads(&mut self) -> Result<()> {
        self.fallible("finalize_grads", |m| m.finalize_grads())
    }

    fn take_metrics(&mut self) -> Vec<(String, f64)> {
        self.fallible("take_metrics", |m| Ok(m.take_metrics())).unwrap_or_default()
    }

    fn num_model_chunks(&self) -> usize {
        self.infallible("num_model_chunks", |m| m.num_model_chunks())
    }

    fn forward_chunk(
        &mut self,
        chunk: usize,
        microbatch: usize,
        batch: &Batch,
        input: Option<DeviceTensor>,
        mode: Mode,
    ) -> Result<StageOutput> {
        self.fallible("forward_chunk", |m| m.forward_chunk(chunk, microbatch, batch, input, mode))
    }

    fn backward_chunk(
        &mut self,
        chunk: usize,
        microbatch: usize,
        grad_output: Option<DeviceTensor>,
        grad_scale: f32,
        on_grads_ready: GradsReadyHook,
    ) -> Result<Option<DeviceTensor>> {
        self.fallible("backward_chunk", |m| {
            m.backward_chunk(chunk, microbatch, grad_output, grad_scale, on_grads_ready)
        })
    }

    fn set_forward_pre_hook(&mut self, hook: crate::SharedForwardPreHook) -> bool {
        let (guard, inner) = (self.guard, &mut self.inner);
        match guard.call(|| inner.set_forward_pre_hook(hook)) {
            Ok(r) => r,
            Err(m) => panic!("plugin {} panicked in set_forward_pre_hook: {m}", self.label),
        }
    }

    fn take_eval_metrics(&mut self) -> Vec<(String, f64)> {
        self.fallible("take_eval_metrics", |m| Ok(m.take_eval_metrics())).unwrap_or_default()
    }

    fn logits_rows(&mut self, tokens: &[i32], b: usize, s: usize, rows: &[usize]) -> Result<Option<DeviceTensor>> {
        self.fallible("logits_rows", |m| m.logits_rows(tokens, b, s, rows))
    }
}

#[cfg(test)]
mod tests {
    use super::GuardedModel;
    use crate::plugin_loader::PanicGuard;
    use crate::recording_model::assert_forwards_every_method;

    #[test]
    fn guarded_model_forwards_every_method() {
        assert_forwards_every_method("GuardedModel", |inner, run| {
            run(&mut GuardedModel::new(Box::new(inner), PanicGuard::in_process(), "test model".into()))
        });
    }
}
