//! Test support for [`Model`] wrappers: a [`RecordingModel`] that logs every method called on
//! it, and [`assert_forwards_every_method`], which calls every [`Model`] method once on a wrapper
//! of it and fails unless each call reached the inner model. A wrapper that misses a forwarder
//! runs the `Model` trait's default instead, which the inner model never sees.
//!
//! [`MODEL_METHODS`] is the list of `Model` methods; a unit test of
//! [`crate::model_wrapper`] compares it with the `trait Model` source, so a method added to the
//! trait fails that test until it is added here (and to [`RecordingModel`] and
//! [`call_every_method`], or the check fails for every wrapper).

use crate::{Batch, DeviceTensor, GradsReadyHook, LossReport, Mode, Model, Param, Result, StageOutput};
use anyhow::bail;
use std::sync::{Arc, Mutex};

/// Every method of [`Model`], in the trait's order.
pub const MODEL_METHODS: [&str; 23] = [
    "name",
    "forward",
    "backward",
    "logits",
    "params",
    "params_mut",
    "buffers",
    "buffers_mut",
    "zero_grad",
    "flops_per_iteration",
    "is_first_stage",
    "is_last_stage",
    "stage_buffer",
    "forward_stage",
    "backward_stage",
    "finalize_grads",
    "take_metrics",
    "num_model_chunks",
    "forward_chunk",
    "backward_chunk",
    "set_forward_pre_hook",
    "take_eval_metrics",
    "logits_rows",
];

/// The methods a [`RecordingModel`] saw, in call order; shared with the test holding it.
pub type CallLog = Arc<Mutex<Vec<&'static str>>>;

/// A [`Model`] that implements every method by logging its name (fallible methods then return
/// an error, which [`call_every_method`] ignores).
pub struct RecordingModel {
    log: CallLog,
}

impl RecordingModel {
    pub fn new() -> (RecordingModel, CallLog) {
        let log = CallLog::default();
        (RecordingModel { log: log.clone() }, log)
    }

    fn saw(&self, method: &'static str) {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).push(method);
    }

    fn saw_err<T>(&self, method: &'static str) -> Result<T> {
        self.saw(method);
        bail!("RecordingModel::{method} records calls only")
    }
}

impl Model for RecordingModel {
    fn name(&self) -> &str {
        self.saw("name");
        "recording"
    }
    fn forward(&mut self, _: &Batch, _: Mode) -> Result<LossReport> {
        self.saw_err("forward")
    }
    fn backward(&mut self, _: f32) -> Result<()> {
        self.saw_err("backward")
    }
    fn logits(&mut self, _: &[i32], _: usize, _: usize) -> Result<DeviceTensor> {
        self.saw_err("logits")
    }
    fn params(&self) -> Vec<&Param> {
        self.saw("params");
        Vec::new()
    }
    fn params_mut(&mut self) -> Vec<&mut Param> {
        self.saw("params_mut");
        Vec::new()
    }
    fn buffers(&self) -> Vec<&Param> {
        self.saw("buffers");
        Vec::new()
    }
    fn buffers_mut(&mut self) -> Vec<&mut Param> {
        self.saw("buffers_mut");
        Vec::new()
    }
    fn zero_grad(&mut self) -> Result<()> {
        self.saw_err("zero_grad")
    }
    fn flops_per_iteration(&self, _: usize) -> f64 {
        self.saw("flops_per_iteration");
        0.0
    }
    fn is_first_stage(&self) -> bool {
        self.saw("is_first_stage");
        false
    }
    fn is_last_stage(&self) -> bool {
        self.saw("is_last_stage");
        false
    }
    fn stage_buffer(&self, _: &Batch) -> Result<DeviceTensor> {
        self.saw_err("stage_buffer")
    }
    fn forward_stage(&mut self, _: usize, _: &Batch, _: Option<DeviceTensor>, _: Mode) -> Result<StageOutput> {
        self.saw_err("forward_stage")
    }
    fn backward_stage(
        &mut self,
        _: usize,
        _: Option<DeviceTensor>,
        _: f32,
        _: GradsReadyHook,
    ) -> Result<Option<DeviceTensor>> {
        self.saw_err("backward_stage")
    }
    fn finalize_grads(&mut self) -> Result<()> {
        self.saw_err("finalize_grads")
    }
    fn take_metrics(&mut self) -> Vec<(String, f64)> {
        self.saw("take_metrics");
        Vec::new()
    }
    fn num_model_chunks(&self) -> usize {
        self.saw("num_model_chunks");
        2
    }
    fn forward_chunk(
        &mut self,
        _: usize,
        _: usize,
        _: &Batch,
        _: Option<DeviceTensor>,
        _: Mode,
    ) -> Result<StageOutput> {
        self.saw_err("forward_chunk")
    }
    fn backward_chunk(
        &mut self,
        _: usize,
        _: usize,
        _: Option<DeviceTensor>,
        _: f32,
        _: GradsReadyHook,
    ) -> Result<Option<DeviceTensor>> {
        self.saw_err("backward_chunk")
    }
    fn set_forward_pre_hook(&mut self, _: crate::SharedForwardPreHook) -> bool {
        self.saw("set_forward_pre_hook");
        true
    }
    fn take_eval_metrics(&mut self) -> Vec<(String, f64)> {
        self.saw("take_eval_metrics");
        Vec::new()
    }
    fn logits_rows(&mut self, _: &[i32], _: usize, _: usize, _: &[usize]) -> Result<Option<DeviceTensor>> {
        self.saw_err("logits_rows")
    }
}

/// A pre-hook that does nothing (an argument for `set_forward_pre_hook`).
struct NoHook;

impl crate::ForwardPreHook for NoHook {
    fn before_forward(&mut self, _: &mut [&mut Param]) -> Result<()> {
        Ok(())
    }
    fn finish(&mut self, _: &mut [&mut Param]) -> Result<()> {
        Ok(())
    }
}

/// Calls every [`Model`] method of `model` once, in [`MODEL_METHODS`] order, ignoring results
/// (a wrapper may turn the recording model's errors into others; only the calls matter).
pub fn call_every_method(model: &mut dyn Model) {
    let batch =
        Batch { micro_batch_size: 1, seq_length: 1, tokens: vec![0], labels: vec![0], loss_mask: vec![1.0], seed: 0 };
    let mut ready = |_: &[&Param]| Ok(());
    let _ = model.name();
    let _ = model.forward(&batch, Mode::Train);
    let _ = model.backward(1.0);
    let _ = model.logits(&batch.tokens, 1, 1);
    let _ = model.params();
    let _ = model.params_mut();
    let _ = model.buffers();
    let _ = model.buffers_mut();
    let _ = model.zero_grad();
    let _ = model.flops_per_iteration(1);
    let _ = model.is_first_stage();
    let _ = model.is_last_stage();
    let _ = model.stage_buffer(&batch);
    let _ = model.forward_stage(0, &batch, None, Mode::Train);
    let _ = model.backward_stage(0, None, 1.0, &mut ready);
    let _ = model.finalize_grads();
    let _ = model.take_metrics();
    let _ = model.num_model_chunks();
    let _ = model.forward_chunk(1, 0, &batch, None, Mode::Train);
    let _ = model.backward_chunk(1, 0, None, 1.0, &mut ready);
    let _ = model.set_forward_pre_hook(Arc::new(Mutex::new(NoHook)));
    let _ = model.take_eval_metrics();
    let _ = model.logits_rows(&batch.tokens, 1, 1, &[0]);
}

/// Wraps a fresh [`RecordingModel`] with `wrap`, calls every method on the wrapper and panics
/// naming `wrapper` and the methods that did not reach the inner model. Calls the wrapper makes
/// on its own (in its constructor, or several per method) are allowed.
pub fn assert_forwards_every_method(wrapper: &str, wrap: impl FnOnce(RecordingModel, &mut dyn FnMut(&mut dyn Model))) {
    let (inner, log) = RecordingModel::new();
    let mut called = false;
    wrap(inner, &mut |m: &mut dyn Model| {
        log.lock().unwrap_or_else(|e| e.into_inner()).clear();
        call_every_method(m);
        called = true;
    });
    assert!(called, "the test of {wrapper} never ran the calls");
    let seen = log.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let missing: Vec<&str> = MODEL_METHODS.iter().copied().filter(|m| !seen.contains(m)).collect();
    assert!(missing.is_empty(), "{wrapper} does not forward {missing:?} to the wrapped model (it saw {seen:?})");
}

/// The `fn` names declared directly in the block opening with `header` (a trait or impl) of
/// `source`, in order: the methods at the block's first indentation level.
pub fn trait_method_names(source: &str, header: &str) -> Vec<String> {
    let start = source.find(header).unwrap_or_else(|| panic!("`{header}` not found"));
    let mut names = Vec::new();
    for line in source[start + header.len()..].lines() {
        if line == "}" {
            break;
        }
        if let Some(rest) = line.strip_prefix("    fn ") {
            let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
            names.push(rest[..end].to_string());
        }
    }
    names
}
