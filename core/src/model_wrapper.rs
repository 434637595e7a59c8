//! [`ModelWrapper`]: the one mechanism for a [`Model`] that wraps another model and changes a few
//! of its methods (the plugin panic guard [`crate::guarded_model::GuardedModel`], fp16 loss
//! scaling, the pipeline compute probe).
//!
//! A wrapper implements [`ModelWrapper`]: it names its inner model ([`ModelWrapper::wrapped`],
//! [`ModelWrapper::wrapped_mut`]) and overrides only the methods it changes; every other method's
//! default forwards to the inner model, and the blanket `impl<W: ModelWrapper> Model for W` makes
//! the wrapper a [`Model`].
//!
//! Why a trait with forwarding defaults: a hand-written wrapper must forward every [`Model`]
//! method, and one it misses silently runs the `Model` trait's default instead of the inner
//! model's method (this is how `GuardedModel` lost `set_forward_pre_hook` and the model-chunk
//! methods of plugin models). A `delegate!`-style macro would also list every method once, but a
//! wrapper that changes a method would then need an exclusion list; with trait defaults the
//! compiler picks the override. Adding a [`Model`] method means adding it here twice (the
//! forwarding default and the blanket impl's line), next to each other; the unit test
//! `wrapper_and_blanket_impl_list_every_model_method` fails until both are there, and every
//! wrapper's test runs [`crate::recording_model::assert_forwards_every_method`].

use crate::{Batch, DeviceTensor, GradsReadyHook, LossReport, Mode, Model, Param, Result, StageOutput};

/// A [`Model`] wrapping another; see the module doc. Every method forwards by default.
pub trait ModelWrapper: Send {
    /// The wrapped model.
    fn wrapped(&self) -> &dyn Model;
    fn wrapped_mut(&mut self) -> &mut dyn Model;

    fn name(&self) -> &str {
        self.wrapped().name()
    }
    fn forward(&mut self, batch: &Batch, mode: Mode) -> Result<LossReport> {
        self.wrapped_mut().forward(batch, mode)
    }
    fn backward(&mut self, grad_scale: f32) -> Result<()> {
        self.wrapped_mut().backward(grad_scale)
    }
    fn logits(&mut self, tokens: &[i32], micro_batch_size: usize, seq_length: usize) -> Result<DeviceTensor> {
        self.wrapped_mut().logits(tokens, micro_batch_size, seq_length)
    }
    fn params(&self) -> Vec<&Param> {
        self.wrapped().params()
    }
    fn params_mut(&mut self) -> Vec<&mut Param> {
        self.wrapped_mut().params_mut()
    }
    fn buffers(&self) -> Vec<&Param> {
        self.wrapped().buffers()
    }
    fn buffers_mut(&mut self) -> Vec<&mut Param> {
        self.wrapped_mut().buffers_mut()
    }
    fn zero_grad(&mut self) -> Result<()> {
        self.wrapped_mut().zero_grad()
    }
    fn flops_per_iteration(&self, samples: usize) -> f64 {
        self.wrapped().flops_per_iteration(samples)
    }
    fn is_first_stage(&self) -> bool {
        self.wrapped().is_first_stage()
    }
    fn is_last_stage(&self) -> bool {
        self.wrapped().is_last_stage()
    }
    fn stage_buffer(&self, batch: &Batch) -> Result<DeviceTensor> {
        self.wrapped().stage_buffer(batch)
    }
    fn forward_stage(
        &mut self,
        microbatch: usize,
        batch: &Batch,
        input: Option<DeviceTensor>,
        mode: Mode,
    ) -> Result<StageOutput> {
        self.wrapped_mut().forward_stage(microbatch, batch, input, mode)
    }
    fn backward_stage(
        &mut self,
        microbatch: usize,
        grad_output: Option<DeviceTensor>,
        grad_scale: f32,
        on_grads_ready: GradsReadyHook,
    ) -> Result<Option<DeviceTensor>> {
        self.wrapped_mut().backward_stage(microbatch, grad_output, grad_scale, on_grads_ready)
    }
    fn finalize_grads(&mut self) -> Result<()> {
        self.wrapped_mut().finalize_grads()
    }
    fn take_metrics(&mut self) -> Vec<(String, f64)> {
        self.wrapped_mut().take_metrics()
    }
    fn num_model_chunks(&self) -> usize {
        self.wrapped().num_model_chunks()
    }
    fn forward_chunk(
        &mut self,
        chunk: usize,
        microbatch: usize,
        batch: &Batch,
        input: Option<DeviceTensor>,
        mode: Mode,
    ) -> Result<StageOutput> {
        self.wrapped_mut().forward_chunk(chunk, microbatch, batch, input, mode)
    }
    fn backward_chunk(
        &mut self,
        chunk: usize,
        microbatch: usize,
        grad_output: Option<DeviceTensor>,
        grad_scale: f32,
        on_grads_ready: GradsReadyHook,
    ) -> Result<Option<DeviceTensor>> {
        self.wrapped_mut().backward_chunk(chunk, microbatch, grad_output, grad_scale, on_grads_ready)
    }
    fn set_forward_pre_hook(&mut self, hook: crate::SharedForwardPreHook) -> bool {
        self.wrapped_mut().set_forward_pre_hook(hook)
    }
    fn take_eval_metrics(&mut self) -> Vec<(String, f64)> {
        self.wrapped_mut().take_eval_metrics()
    }
    fn logits_rows(
        &mut self,
        tokens: &[i32],
        micro_batch_size: usize,
        seq_length: usize,
        rows: &[usize],
    ) -> Result<Option<DeviceTensor>> {
        self.wrapped_mut().logits_rows(tokens, micro_batch_size, seq_length, rows)
    }
}

/// Every [`Model`] method goes to the wrapper's method of the same name (its override, or the
/// forwarding default).
impl<W: ModelWrapper> Model for W {
    fn name(&self) -> &str {
        ModelWrapper::name(self)
    }
    fn forward(&mut self, batch: &Batch, mode: Mode) -> Result<LossReport> {
        ModelWrapper::forward(self, batch, mode)
    }
    fn backward(&mut self, grad_scale: f32) -> Result<()> {
        ModelWrapper::backward(self, grad_scale)
    }
    fn logits(&mut self, tokens: &[i32], micro_batch_size: usize, seq_length: usize) -> Result<DeviceTensor> {
        ModelWrapper::logits(self, tokens, micro_batch_size, seq_length)
    }
    fn params(&self) -> Vec<&Param> {
        ModelWrapper::params(self)
    }
    fn params_mut(&mut self) -> Vec<&mut Param> {
        ModelWrapper::params_mut(self)
    }
    fn buffers(&self) -> Vec<&Param> {
        ModelWrapper::buffers(self)
    }
    fn buffers_mut(&mut self) -> Vec<&mut Param> {
        ModelWrapper::buffers_mut(self)
    }
    fn zero_grad(&mut self) -> Result<()> {
        ModelWrapper::zero_grad(self)
    }
    fn flops_per_iteration(&self, samples: usize) -> f64 {
        ModelWrapper::flops_per_iteration(self, samples)
    }
    fn is_first_stage(&self) -> bool {
        ModelWrapper::is_first_stage(self)
    }
    fn is_last_stage(&self) -> bool {
        ModelWrapper::is_last_stage(self)
    }
    fn stage_buffer(&self, batch: &Batch) -> Result<DeviceTensor> {
        ModelWrapper::stage_buffer(self, batch)
    }
    fn forward_stage(
        &mut self,
        microbatch: usize,
        batch: &Batch,
        input: Option<DeviceTensor>,
        mode: Mode,
    ) -> Result<StageOutput> {
        ModelWrapper::forward_stage(self, microbatch, batch, input, mode)
    }
    fn backward_stage(
        &mut self,
        microbatch: usize,
        grad_output: Option<DeviceTensor>,
        grad_scale: f32,
        on_grads_ready: GradsReadyHook,
    ) -> Result<Option<DeviceTensor>> {
        ModelWrapper::backward_stage(self, microbatch, grad_output, grad_scale, on_grads_ready)
    }
    fn finalize_grads(&mut self) -> Result<()> {
        ModelWrapper::finalize_grads(self)
    }
    fn take_metrics(&mut self) -> Vec<(String, f64)> {
        ModelWrapper::take_metrics(self)
    }
    fn num_model_chunks(&self) -> usize {
        ModelWrapper::num_model_chunks(self)
    }
    fn forward_chunk(
        &mut self,
        chunk: usize,
        microbatch: usize,
        batch: &Batch,
        input: Option<DeviceTensor>,
        mode: Mode,
    ) -> Result<StageOutput> {
        ModelWrapper::forward_chunk(self, chunk, microbatch, batch, input, mode)
    }
    fn backward_chunk(
        &mut self,
        chunk: usize,
        microbatch: usize,
        grad_output: Option<DeviceTensor>,
        grad_scale: f32,
        on_grads_ready: GradsReadyHook,
    ) -> Result<Option<DeviceTensor>> {
        ModelWrapper::backward_chunk(self, chunk, microbatch, grad_output, grad_scale, on_grads_ready)
    }
    fn set_forward_pre_hook(&mut self, hook: crate::SharedForwardPreHook) -> bool {
        ModelWrapper::set_forward_pre_hook(self, hook)
    }
    fn take_eval_metrics(&mut self) -> Vec<(String, f64)> {
        ModelWrapper::take_eval_metrics(self)
    }
    fn logits_rows(
        &mut self,
        tokens: &[i32],
        micro_batch_size: usize,
        seq_length: usize,
        rows: &[usize],
    ) -> Result<Option<DeviceTensor>> {
        ModelWrapper::logits_rows(self, tokens, micro_batch_size, seq_length, rows)
    }
}

#[cfg(test)]
mod tests {
    use crate::recording_model::{trait_method_names, MODEL_METHODS};

    /// The `fn` names of `trait Model`, of `trait ModelWrapper` (less `wrapped`/`wrapped_mut`) and
    /// of the blanket impl, read from the sources, are the same list in the same order.
    #[test]
    fn wrapper_and_blanket_impl_list_every_model_method() {
        let model = trait_method_names(include_str!("model.rs"), "pub trait Model: Send {");
        let this = include_str!("model_wrapper.rs");
        let mut wrapper = trait_method_names(this, "pub trait ModelWrapper: Send {");
        wrapper.retain(|m| m != "wrapped" && m != "wrapped_mut");
        let blanket = trait_method_names(this, "impl<W: ModelWrapper> Model for W {");
        assert_eq!(wrapper, model, "ModelWrapper's forwarding defaults vs trait Model");
        assert_eq!(blanket, model, "the blanket impl vs trait Model");
        assert_eq!(MODEL_METHODS.to_vec(), model, "recording_model::MODEL_METHODS vs trait Model");
    }
}
