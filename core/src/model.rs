//! The [`Model`] trait, its parameters ([`Param`] with their parallel layout) and batches.

use crate::{DeviceTensor, Result};
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
}

impl ParamLayout {
    /// A parameter held whole by every rank.
    pub fn replicated(shape: &[usize], no_weight_decay: bool) -> ParamLayout {
        ParamLayout { global_shape: shape.to_vec(), tp_axis: None, tp_rank: 0, tp_size: 1, no_weight_decay }
    }

    /// This shard's `(offset, length)` along every dim of the global tensor.
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

/// A model (one pipeline stage of it) with explicit forward and backward.
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
    /// Sets every gradient to zero.
    fn zero_grad(&mut self) -> Result<()>;
    /// Model FLOPs of one training iteration on `samples` sequences (SPEC §6.13).
    fn flops_per_iteration(&self, samples: usize) -> f64;
}
