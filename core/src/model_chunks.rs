//! [`ModelChunks`]: the model chunks of one pipeline rank under the interleaved 1F1B schedule
//! (SPEC §5.5, Megatron's virtual pipeline stages). Chunk `c` of pipeline rank `r` of `pp` is
//! virtual stage `c·pp + r`, built by the model plugin from
//! [`crate::ParallelContext::with_virtual_stage`]. The composite is one [`Model`] to the
//! driver (parameters, gradients, optimizer, checkpoints see every chunk's parameters under
//! their global names) and exposes each chunk to the schedule through
//! [`Model::forward_chunk`] / [`Model::backward_chunk`].

use crate::{Batch, DeviceTensor, GradsReadyHook, LossReport, Mode, Model, Param, Result, StageOutput};
use anyhow::{bail, Context};

/// The model chunks of one pipeline rank, in chunk order.
pub struct ModelChunks {
    chunks: Vec<Box<dyn Model>>,
}

impl ModelChunks {
    /// `chunks[c]` must be the model built for chunk `c` (at least two chunks).
    pub fn new(chunks: Vec<Box<dyn Model>>) -> Result<ModelChunks> {
        if chunks.len() < 2 {
            bail!("an interleaved pipeline rank needs at least 2 model chunks, got {}", chunks.len());
        }
        Ok(ModelChunks { chunks })
    }

    fn chunk_mut(&mut self, chunk: usize) -> Result<&mut Box<dyn Model>> {
        let n = self.chunks.len();
        self.chunks.get_mut(chunk).with_context(|| format!("model chunk {chunk} does not exist ({n} chunks)"))
    }

    fn whole(&self, what: &str) -> anyhow::Error {
        anyhow::anyhow!(
            "model `{}` is split into {} interleaved pipeline chunks: `{what}` of the whole model is not available; \
             run it through the interleaved schedule",
            self.chunks[0].name(),
            self.chunks.len()
        )
    }
}

impl Model for ModelChunks {
    fn name(&self) -> &str {
        self.chunks[0].name()
    }
    fn forward(&mut self, _batch: &Batch, _mode: Mode) -> Result<LossReport> {
        Err(self.whole("forward"))
    }
    fn backward(&mut self, _grad_scale: f32) -> Result<()> {
        Err(self.whole("backward"))
    }
    fn logits(&mut self, _tokens: &[i32], _micro_batch_size: usize, _seq_length: usize) -> Result<DeviceTensor> {
        Err(self.whole("logits"))
    }
    /// Chunk 0's parameters first, then chunk 1's, … (global names, disjoint layers).
    fn params(&self) -> Vec<&Param> {
        self.chunks.iter().flat_map(|c| c.params()).collect()
    }
    fn params_mut(&mut self) -> Vec<&mut Param> {
        self.chunks.iter_mut().flat_map(|c| c.params_mut()).collect()
    }
    fn buffers(&self) -> Vec<&Param> {
        self.chunks.iter().flat_map(|c| c.buffers()).collect()
    }
    fn buffers_mut(&mut self) -> Vec<&mut Param> {
        self.chunks.iter_mut().flat_map(|c| c.buffers_mut()).collect()
    }
    fn zero_grad(&mut self) -> Result<()> {
        self.chunks.iter_mut().try_for_each(|c| c.zero_grad())
    }
    /// Every chunk reports the FLOPs of the whole model; count them once.
    fn flops_per_iteration(&self, samples: usize) -> f64 {
        self.chunks[0].flops_per_iteration(samples)
    }
    fn is_first_stage(&self) -> bool {
        self.chunks[0].is_first_stage()
    }
    fn is_last_stage(&self) -> bool {
        self.chunks.last().is_some_and(|c| c.is_last_stage())
    }
    /// Every chunk exchanges activations of the same shape.
    fn stage_buffer(&self, batch: &Batch) -> Result<DeviceTensor> {
        self.chunks[0].stage_buffer(batch)
    }
    fn forward_stage(
        &mut self,
        microbatch: usize,
        _batch: &Batch,
        _input: Option<DeviceTensor>,
        _mode: Mode,
    ) -> Result<StageOutput> {
        bail!("{} (microbatch {microbatch})", self.whole("forward_stage without a chunk"))
    }
    fn backward_stage(
        &mut self,
        microbatch: usize,
        _grad_output: Option<DeviceTensor>,
        _grad_scale: f32,
        _on_grads_ready: GradsReadyHook,
    ) -> Result<Option<DeviceTensor>> {
        bail!("{} (microbatch {microbatch})", self.whole("backward_stage without a chunk"))
    }
    /// Each chunk's own reductions, in chunk order (the same on every rank of a group: the
    /// tied-embedding all-reduce runs in the one chunk holding the embedding or its copy).
    fn finalize_grads(&mut self) -> Result<()> {
        self.chunks.iter_mut().try_for_each(|c| c.finalize_grads())
    }
    fn take_metrics(&mut self) -> Vec<(String, f64)> {
        self.chunks.iter_mut().flat_map(|c| c.take_metrics()).collect()
    }
    fn take_eval_metrics(&mut self) -> Vec<(String, f64)> {
        self.chunks.iter_mut().flat_map(|c| c.take_eval_metrics()).collect()
    }
    fn num_model_chunks(&self) -> usize {
        self.chunks.len()
    }
    fn forward_chunk(
        &mut self,
        chunk: usize,
        microbatch: usize,
        batch: &Batch,
        input: Option<DeviceTensor>,
        mode: Mode,
    ) -> Result<StageOutput> {
        self.chunk_mut(chunk)?.forward_stage(microbatch, batch, input, mode)
    }
    fn backward_chunk(
        &mut self,
        chunk: usize,
        microbatch: usize,
        grad_output: Option<DeviceTensor>,
        grad_scale: f32,
        on_grads_ready: GradsReadyHook,
    ) -> Result<Option<DeviceTensor>> {
        self.chunk_mut(chunk)?.backward_stage(microbatch, grad_output, grad_scale, on_grads_ready)
    }
    /// Every chunk gets the hook; `true` only when every chunk calls it.
    fn set_forward_pre_hook(&mut self, hook: crate::SharedForwardPreHook) -> bool {
        // Every chunk, even after one that declines (no short circuit).
        let installed: Vec<bool> = self.chunks.iter_mut().map(|c| c.set_forward_pre_hook(hook.clone())).collect();
        installed.iter().all(|&b| b)
    }
}
