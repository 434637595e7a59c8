//! `--pipeline-probe-compute-ms MS` (hidden, for measurements): [`ProbeCompute`] makes every
//! pipeline rank sleep `MS` ms per microbatch forward and `2·MS` per backward on top of its real
//! compute, split evenly over its model chunks (`MS / V` per chunk forward).
//!
//! Why: the pipeline bubble is wall-clock idle time, and measuring it needs every rank to run
//! at full speed at once. On a machine with fewer cores than ranks (pp4 on 2 cores) the rank
//! threads time-slice, so "compute" stretches and the measured idle time means little. A sleep
//! needs no core: with it dominating, the stages are equal (as the formula `(pp − 1)/(V·M)`
//! assumes) and the real schedule — its order, its dependencies, its p2p transfers — is timed
//! by `--timing-log-level 1` as it would run with a core per rank. It changes no numbers.

use anyhow::Result;
use megatron_core::{Batch, DeviceTensor, GradsReadyHook, LossReport, Mode, Model, ModelWrapper, StageOutput};
use std::time::Duration;

/// A model whose stage/chunk forwards and backwards also sleep (see the module doc).
pub struct ProbeCompute<'a> {
    inner: &'a mut dyn Model,
    /// Sleep of one chunk's forward; the backward sleeps twice as long.
    forward: Duration,
}

impl<'a> ProbeCompute<'a> {
    /// `ms` per microbatch forward of the whole rank (all its chunks).
    pub fn new(inner: &'a mut dyn Model, ms: f64) -> ProbeCompute<'a> {
        let chunks = inner.num_model_chunks().max(1) as f64;
        ProbeCompute { forward: Duration::from_secs_f64(ms.max(0.0) / 1e3 / chunks), inner }
    }
}

/// Sleeps in the forwards and backwards the schedules call; every other method forwards
/// ([`ModelWrapper`]).
impl ModelWrapper for ProbeCompute<'_> {
    fn wrapped(&self) -> &dyn Model {
        &*self.inner
    }
    fn wrapped_mut(&mut self) -> &mut dyn Model {
        &mut *self.inner
    }
    fn forward(&mut self, batch: &Batch, mode: Mode) -> Result<LossReport> {
        std::thread::sleep(self.forward);
        self.inner.forward(batch, mode)
    }
    fn backward(&mut self, grad_scale: f32) -> Result<()> {
        std::thread::sleep(2 * self.forward);
        self.inner.backward(grad_scale)
    }
    fn forward_stage(
        &mut self,
        microbatch: usize,
        batch: &Batch,
        input: Option<DeviceTensor>,
        mode: Mode,
    ) -> Result<StageOutput> {
        std::thread::sleep(self.forward);
        self.inner.forward_stage(microbatch, batch, input, mode)
    }
    fn backward_stage(
        &mut self,
        microbatch: usize,
        grad_output: Option<DeviceTensor>,
        grad_scale: f32,
        on_grads_ready: GradsReadyHook,
    ) -> Result<Option<DeviceTensor>> {
        std::thread::sleep(2 * self.forward);
        self.inner.backward_stage(microbatch, grad_output, grad_scale, on_grads_ready)
    }
    fn forward_chunk(
        &mut self,
        chunk: usize,
        microbatch: usize,
        batch: &Batch,
        input: Option<DeviceTensor>,
        mode: Mode,
    ) -> Result<StageOutput> {
        std::thread::sleep(self.forward);
        self.inner.forward_chunk(chunk, microbatch, batch, input, mode)
    }
    fn backward_chunk(
        &mut self,
        chunk: usize,
        microbatch: usize,
        grad_output: Option<DeviceTensor>,
        grad_scale: f32,
        on_grads_ready: GradsReadyHook,
    ) -> Result<Option<DeviceTensor>> {
        std::thread::sleep(2 * self.forward);
        self.inner.backward_chunk(chunk, microbatch, grad_output, grad_scale, on_grads_ready)
    }
}

#[cfg(test)]
mod tests {
    use super::ProbeCompute;
    use megatron_core::recording_model::assert_forwards_every_method;

    #[test]
    fn probe_compute_forwards_every_method() {
        assert_forwards_every_method("ProbeCompute", |mut inner, run| run(&mut ProbeCompute::new(&mut inner, 0.0)));
    }
}
