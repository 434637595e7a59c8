//! The [`Model`] trait, its parameters ([`Param`] with their parallel layout) and batches.
//!
//! A model object is one pipeline stage of the whole model (all of it when pp = 1). Schedules
//! drive it through the stage API ([`Model::forward_stage`] / [`Model::backward_stage`]), which
//! hands `(B, T, C)` activations and their gradients from stage to stage and keeps several
//! microbatches in flight; [`Model::forward`] / [`Model::backward`] are the single-stage,
//! one-microbatch view of the same thing.

use crate::{DeviceTensor, Result};
use anyhow::bail;
use serde::{Deserialize, Serialize};

/// One microbatch, `(b, s)` row-major, as the data loader hands it to the first stage.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    pub micro_batch_size: usize,
    pub seq_length: usize,
    /// Input token ids `(b, s)`.
    pub tokens: Vec<i32>,
    /// Target token ids `(b, s)`: `labels[b, t]` is the target of position `t`.
    pub labels: Vec<i32>,
    /// 1.0 where the token counts towards the loss `(b, s)`.
    pub loss_mask: Vec<f32>,
    /// Seed of every dropout mask of this microbatch. The driver derives it from
    /// `(--seed, iteration, microbatch index)`, so a resumed run draws the same masks.
    pub seed: u64,
}

/// What a forward pass reports (SPEC §6.8): `Σ loss·mask` and `Σ mask` of the microbatch.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossReport {
    pub loss_sum: f64,
    pub num_tokens: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Dropout on, activations saved for backward.
    Train,
    /// Dropout off, nothing saved.
    Eval,
}

/// How a parameter is laid out across tensor-parallel ranks and treated by the optimizer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParamLayout {
    /// Shape of the whole (unsharded) parameter.
    pub global_shape: Vec<usize>,
    /// Dim split over the tensor-parallel group (`None`: replicated on every TP rank).
    pub tp_axis: Option<usize>,
    pub tp_rank: usize,
    pub tp_size: usize,
    /// Weight decay multiplier 0 (biases and all 1-D params, SPEC §6.4).
    pub no_weight_decay: bool,
    /// This tensor is a copy of a parameter of the same name held by another pipeline stage
    /// (the tied word embedding on the last stage, SPEC §4.5). Its gradient is made equal to
    /// the original's by [`Model::finalize_grads`]; the gradient norm counts it once (on the
    /// original) and checkpoints store it once (the original), loading it back by name.
    #[serde(default)]
    pub shared_copy: bool,
    /// Held by one expert-parallel rank only (an MoE expert's weight, SPEC §5.8): its gradient
    /// is reduced over the expert-data-parallel group (`ParallelContext::edp_group`), the
    /// gradient norm adds it up over the expert-parallel group, and checkpoints are written
    /// by expert-data-parallel rank 0.
    #[serde(default)]
    pub expert_parallel: bool,
    /// The tensor is `tp_chunks` equal blocks stacked along `tp_axis`, each split over the TP
    /// ranks on its own (SwiGLU's `linear_fc1` is [gate; up]: a rank holds [gate_r; up_r]).
    /// 1 for a plain split. Checkpoints store each block's slice at its place in the global
    /// tensor, so the stored tensor is the same at every TP size ([`ParamLayout::shard_boxes`]).
    #[serde(default = "one_chunk")]
    pub tp_chunks: usize,
    /// Blocks of unequal sizes (their global lengths along `tp_axis`, summing to it), each
    /// split over the TP ranks on its own: Mamba's `in_proj` is [z; x; B; C; dt], a rank holds
    /// [z_r; x_r; B_r; C_r; dt_r]. Empty: the `tp_chunks` equal blocks above.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tp_blocks: Vec<usize>,
}

fn one_chunk() -> usize {
    1
}

impl ParamLayout {
    /// A parameter held whole by every rank.
    pub fn replicated(shape: &[usize], no_weight_decay: bool) -> ParamLayout {
        ParamLayout {
            global_shape: shape.to_vec(),
            tp_axis: None,
            tp_rank: 0,
            tp_size: 1,
            no_weight_decay,
            shared_copy: false,
            expert_parallel: false,
            tp_chunks: 1,
            tp_blocks: Vec::new(),
        }
    }

    /// Where this shard's pieces lie: for each of the `tp_chunks` blocks, the piece's first
    /// index along `tp_axis` in the local tensor and its `(offset, length)` along every dim of
    /// the global tensor. One piece (at local 0, the [`ParamLayout::shard_slice`]) unless the
    /// parameter is chunked and split over more than one rank.
    pub fn shard_boxes(&self, local_shape: &[usize]) -> Vec<(usize, Vec<(usize, usize)>)> {
        if let Some(axis) =
            self.tp_axis.filter(|&a| self.tp_blocks.len() > 1 && self.tp_size > 1 && a < local_shape.len())
        {
            // Unequal blocks: block c starts at the sum of the earlier blocks, globally and locally.
            let (mut global_at, mut local_at) = (0, 0);
            return self
                .tp_blocks
                .iter()
                .map(|&g| {
                    let local_block = g / self.tp_size;
                    let mut slice: Vec<(usize, usize)> = local_shape.iter().map(|&len| (0, len)).collect();
                    slice[axis] = (global_at + self.tp_rank * local_block, local_block);
                    let piece = (local_at, slice);
                    (global_at, local_at) = (global_at + g, local_at + local_block);
                    piece
                })
                .collect();
        }
        let chunks = self.tp_chunks.max(1);
        let Some(axis) = self.tp_axis.filter(|&a| chunks > 1 && self.tp_size > 1 && a < local_shape.len()) else {
            return vec![(0, self.shard_slice(local_shape))];
        };
        let local_block = local_shape[axis] / chunks;
        let global_block = self.global_shape.get(axis).copied().unwrap_or(0) / chunks;
        (0..chunks)
            .map(|c| {
                let mut slice: Vec<(usize, usize)> = local_shape.iter().map(|&len| (0, len)).collect();
                slice[axis] = (c * global_block + self.tp_rank * local_block, local_block);
                (c * local_block, slice)
            })
            .collect()
    }

    /// This shard's `(offset, length)` along every dim of the global tensor, as one box: right
    /// only for `tp_chunks == 1` (use [`ParamLayout::shard_boxes`] in general).
    pub fn shard_slice(&self, local_shape: &[usize]) -> Vec<(usize, usize)> {
        local_shape
            .iter()
            .enumerate()
            .map(|(d, &len)| if Some(d) == self.tp_axis { (self.tp_rank * len, len) } else { (0, len) })
            .collect()
    }
}

/// A trainable tensor with its gradient buffer (same shape, fp32 "main grad").
#[derive(Debug)]
pub struct Param {
    /// Megatron-Core state-dict name (SPEC §4.14), e.g. `decoder.layers.0.mlp.linear_fc1.weight`.
    pub name: String,
    pub value: DeviceTensor,
    pub grad: DeviceTensor,
    pub layout: ParamLayout,
}

/// What one stage's forward of a microbatch produces.
#[derive(Debug)]
pub enum StageOutput {
    /// `(B, T, C)` hidden states for the next stage (every stage but the last).
    Hidden(DeviceTensor),
    /// The loss sums of the microbatch (the last stage).
    Loss(LossReport),
}

/// Called with parameters whose gradients are final for the backward call in progress.
pub type GradsReadyHook<'a> = &'a mut dyn FnMut(&[&Param]) -> Result<()>;

/// A model (one pipeline stage of it) with explicit forward and backward.
///
/// # Stage contract (pipeline parallelism, SPEC §5.5)
/// * The first stage ([`Model::is_first_stage`], Megatron's `pre_process`) embeds the batch's
///   tokens; every other stage takes the previous stage's `(B, T, C)` output as `input`.
/// * The last stage ([`Model::is_last_stage`], `post_process`) returns the loss; the others
///   return their `(B, T, C)` output for the next stage.
/// * Several microbatches may be in flight (1F1B keeps up to `pp - stage` of them): what a
///   training forward saves is keyed by the caller's `microbatch` id and freed by that
///   microbatch's backward. Ids must be unique among the microbatches in flight.
/// * `backward_stage` of the last stage starts from `d loss / d per_token_loss = grad_scale *
///   loss_mask` (`grad_output` is `None`); other stages take `grad_output`, the gradient of
///   their output `(B, T, C)` (what the next stage's backward returned). It returns the
///   gradient of the stage input on every stage but the first (`None` there).
/// * `on_grads_ready` is called once for every parameter of the stage per backward call,
///   right after that parameter's gradient contribution of this microbatch has been
///   accumulated, in backward order (output layer, last layer, ..., first layer, embedding),
///   so a data-parallel reducer can start on those gradients while backward continues.
pub trait Model: Send {
    /// Registered architecture name (`gpt`, ...).
    fn name(&self) -> &str;
    /// Runs one microbatch; in [`Mode::Train`] saves what backward needs (one microbatch in
    /// flight at a time). Returns the loss sums on the last stage.
    fn forward(&mut self, batch: &Batch, mode: Mode) -> Result<LossReport>;
    /// Backpropagates the saved microbatch with `d loss / d per_token_loss = grad_scale *
    /// loss_mask`, accumulating into every [`Param::grad`].
    fn backward(&mut self, grad_scale: f32) -> Result<()>;
    /// Logits `(b, s, V_padded/tp)` of this rank for `tokens (b, s)` (no loss, no saving).
    fn logits(&mut self, tokens: &[i32], micro_batch_size: usize, seq_length: usize) -> Result<DeviceTensor>;
    fn params(&self) -> Vec<&Param>;
    fn params_mut(&mut self) -> Vec<&mut Param>;
    /// Non-trained state saved in checkpoints next to the parameters (see
    /// [`crate::MlpModule::buffers`]); the optimizer never sees it.
    fn buffers(&self) -> Vec<&Param> {
        Vec::new()
    }
    fn buffers_mut(&mut self) -> Vec<&mut Param> {
        Vec::new()
    }
    /// Sets every gradient to zero.
    fn zero_grad(&mut self) -> Result<()>;
    /// Model FLOPs of one iteration on `samples` sequences (SPEC §6.13).
    fn flops_per_iteration(&self, samples: usize) -> f64;

    /// Megatron's `pre_process`: this stage embeds tokens. Single-stage models: `true`.
    fn is_first_stage(&self) -> bool {
        true
    }
    /// Megatron's `post_process`: this stage computes the loss. Single-stage models: `true`.
    fn is_last_stage(&self) -> bool {
        true
    }

    /// A zero tensor of the shape (and on the backend) of the activations passed between
    /// stages for `batch`, `(B, T, C)`: the receive buffer of a pipeline schedule.
    fn stage_buffer(&self, batch: &Batch) -> Result<DeviceTensor> {
        bail!(
            "model `{}` is a single pipeline stage and exchanges no activations (batch {}x{});              use --pipeline-model-parallel-size 1",
            self.name(),
            batch.micro_batch_size,
            batch.seq_length
        )
    }

    /// One stage's forward of microbatch `microbatch` (see the stage contract above). The
    /// default serves single-stage models through [`Model::forward`] (one microbatch in flight).
    fn forward_stage(
        &mut self,
        microbatch: usize,
        batch: &Batch,
        input: Option<DeviceTensor>,
        mode: Mode,
    ) -> Result<StageOutput> {
        if input.is_some() {
            bail!(
                "model `{}` is a single pipeline stage but got an input activation (microbatch {microbatch})",
                self.name()
            );
        }
        Ok(StageOutput::Loss(self.forward(batch, mode)?))
    }

    /// One stage's backward of microbatch `microbatch` (see the stage contract above). The
    /// default serves single-stage models through [`Model::backward`], reporting every
    /// parameter ready at the end.
    fn backward_stage(
        &mut self,
        microbatch: usize,
        grad_output: Option<DeviceTensor>,
        grad_scale: f32,
        on_grads_ready: GradsReadyHook,
    ) -> Result<Option<DeviceTensor>> {
        if grad_output.is_some() {
            bail!(
                "model `{}` is a single pipeline stage but got an output gradient (microbatch {microbatch})",
                self.name()
            );
        }
        self.backward(grad_scale)?;
        on_grads_ready(&self.params())?;
        Ok(None)
    }

    /// Gradient finalize steps owned by the model (SPEC §5.10 step 3): all-reduces the
    /// gradients of parameters held by several stages (the tied word embedding over the
    /// embedding group). Collective over those stages; call once per step after the schedule
    /// (and after or before the data-parallel reduction: both are sums, the order is free).
    fn finalize_grads(&mut self) -> Result<()> {
        Ok(())
    }

    /// Named values the model accumulated since the last call (the MoE losses and expert
    /// loads of [`crate::MlpModule::take_metrics`]), drained; the driver logs them.
    fn take_metrics(&mut self) -> Vec<(String, f64)> {
        Vec::new()
    }

    /// Model chunks (virtual pipeline stages) this rank holds: 1 unless the model is a
    /// [`crate::ModelChunks`] for the interleaved schedule (SPEC §5.5).
    fn num_model_chunks(&self) -> usize {
        1
    }

    /// [`Model::forward_stage`] of model chunk `chunk` (the interleaved schedule). The default
    /// serves one-chunk models.
    fn forward_chunk(
        &mut self,
        chunk: usize,
        microbatch: usize,
        batch: &Batch,
        input: Option<DeviceTensor>,
        mode: Mode,
    ) -> Result<StageOutput> {
        if chunk != 0 {
            bail!("model `{}` holds one model chunk, not chunk {chunk}", self.name());
        }
        self.forward_stage(microbatch, batch, input, mode)
    }

    /// [`Model::backward_stage`] of model chunk `chunk` (the interleaved schedule). The
    /// default serves one-chunk models.
    fn backward_chunk(
        &mut self,
        chunk: usize,
        microbatch: usize,
        grad_output: Option<DeviceTensor>,
        grad_scale: f32,
        on_grads_ready: GradsReadyHook,
    ) -> Result<Option<DeviceTensor>> {
        if chunk != 0 {
            bail!("model `{}` holds one model chunk, not chunk {chunk}", self.name());
        }
        self.backward_stage(microbatch, grad_output, grad_scale, on_grads_ready)
    }

    /// `--overlap-param-gather`: the model calls `hook` with each module's parameters right
    /// before that module's forward (see [`crate::forward_pre_hook`]) and returns `true`. The
    /// default keeps no hook and returns `false`: the driver then waits for every parameter
    /// before each forward.
    fn set_forward_pre_hook(&mut self, _hook: crate::SharedForwardPreHook) -> bool {
        false
    }

    /// Named per-microbatch values of the evaluation forwards since the last call (BERT's
    /// `sop loss`), drained; the driver averages each name over the microbatches of a
    /// validation/test pass and prints it next to the `lm loss`, as Megatron's `evaluate`
    /// does with every key of the loss dict.
    fn take_eval_metrics(&mut self) -> Vec<(String, f64)> {
        Vec::new()
    }

    /// Logits `(rows.len(), V_padded/tp)` of this rank at the flat positions `rows` (`b * seq_length
    /// + t`) of `tokens (b, s)` only: the output layer runs on those rows alone (evaluation scores a
    /// few positions per sample). `None` (the default) when the model has no such path: the
    /// caller then takes the rows from [`Model::logits`].
    fn logits_rows(
        &mut self,
        _tokens: &[i32],
        _micro_batch_size: usize,
        _seq_length: usize,
        _rows: &[usize],
    ) -> Result<Option<DeviceTensor>> {
        Ok(None)
    }
}
