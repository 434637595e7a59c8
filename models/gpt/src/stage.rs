//! The pipeline-stage forward and backward of [`GptModel`] (the [`megatron_core::Model`] stage
//! API, SPEC §5.5) and the tied-embedding gradient finalize (SPEC §5.10 step 3).
//!
//! Several microbatches may be in flight (1F1B keeps up to `pp - stage` on a stage). Each
//! training forward keeps what its backward needs: the token ids (first stage), labels and
//! loss mask (last stage) here, and every module's saved activations, which stay in the
//! module buffers until another forward needs them and are then moved aside (see
//! [`crate::activation_stash`]). A backward never re-runs its forward.

use crate::context_parallel::local_batch;
use crate::model::GptModel;
use anyhow::{bail, Context, Result};
use megatron_core::{Batch, DeviceTensor, GradsReadyHook, LossReport, Mode, ReduceOp, StageOutput};
use megatron_transformer::sequence_parallel::{gather_from_sp_region, reduce_scatter_to_sp_region};
use megatron_transformer::step::{copy_any, ensure_buffer};
use megatron_transformer::tp_mappings::{copy_to_tp_region_backward, copy_to_tp_region_forward};
use megatron_transformer::{linear_backward, linear_forward, SavedActivations, StepInfo};

/// The `(N, C)` lm-head input all-gathered from the `(N/tp, C)` decoder output shards
/// (sequence parallelism).
fn gather_lm_input(
    bk: &dyn megatron_core::Backend,
    ctx: &megatron_core::ParallelContext,
    x: &DeviceTensor,
    step: &StepInfo,
) -> Result<DeviceTensor> {
    let cols = x.shape().last().copied().unwrap_or(0);
    let mut full = bk.zeros(&[step.tokens(), cols], x.dtype())?; // the final norm's dtype
    gather_from_sp_region(ctx, x, &mut full)?;
    Ok(full)
}

/// What the backward of one in-flight training microbatch needs.
pub(crate) struct Saved {
    step: StepInfo,
    tokens: Option<DeviceTensor>, // (B*T) int32, first stage
    labels: Option<DeviceTensor>, // (B*T) int32, last stage
    loss_mask: Vec<f32>,          // (B*T), last stage
    /// The module activations once moved out of the buffers (`None` while they are live).
    pub(crate) activations: Option<SavedActivations>,
}

impl GptModel {
    /// Embedding (first stage) or the received input, then this stage's layers.
    pub(crate) fn run_forward(
        &mut self,
        tokens: Option<&DeviceTensor>,
        input: Option<&DeviceTensor>,
        step: &StepInfo,
    ) -> Result<()> {
        if step.seq > self.config.max_position_embeddings {
            bail!("sequence length {} > max_position_embeddings {}", step.seq, self.config.max_position_embeddings);
        }
        self.forwards += 1;
        // --overlap-param-gather: wait for the embedding's all-gather (the layers wait in the block).
        if let Some(emb) = self.embedding.as_mut() {
            self.decoder.run_pre_hook(emb.params_mut())?;
        }
        let x = self.decoder.input_mut(step)?;
        match (self.embedding.as_mut(), tokens, input) {
            (Some(emb), Some(ids), None) => emb.forward(ids, x, step)?,
            (None, None, Some(hidden)) => self.backend.copy(hidden, x)?,
            _ => bail!("a stage takes token ids on the first pipeline stage and hidden states on the others"),
        }
        self.decoder.forward(step)
    }

    /// Output layer on the decoder output: fills `self.logits (B, T, V/tp)` (last stage).
    pub(crate) fn run_logits(&mut self, step: &StepInfo) -> Result<()> {
        let vocab_local = self.vocab_padded / self.ctx.tp_size();
        // Logits in the activation dtype (Megatron's half logits); the cross entropy widens
        // them and keeps its statistics in fp32, and its in-place backward rounds the fp32
        // gradient once into this buffer (Megatron's `.float()` backward).
        let dtype = self.config.params_dtype;
        ensure_buffer(self.backend.as_ref(), &mut self.logits, &[step.batch, step.seq, vocab_local], dtype)?;
        // The untied output layer or the last stage's embedding copy (tied at pp = 1: nothing new).
        let head: Vec<_> = self.output_layer.iter_mut().chain(self.shared_embedding.iter_mut()).collect();
        if !head.is_empty() {
            self.decoder.run_pre_hook(head)?;
        }
        let w = match (&self.output_layer, &self.shared_embedding, &self.embedding) {
            (Some(p), _, _) | (None, Some(p), _) => &p.value,
            (None, None, Some(e)) => &e.word_embeddings.weight.value,
            (None, None, None) => bail!("pipeline stage {} has no output layer", self.ctx.pp_rank),
        };
        // Output layer: column-parallel, no bias, logits stay vocab-parallel. The padding mask
        // rides in the bias slot: padded vocab ids get logit -inf (see `padding_mask`).
        let x = self.decoder.output();
        if self.sequence_parallel() {
            // SP: the lm-head input is gathered from the token shards (Megatron's output layer is
            // a column-parallel linear with sequence_parallel); backward gathers it again.
            let full = gather_lm_input(self.backend.as_ref(), &self.ctx, x, step)?;
            return linear_forward(self.backend.as_ref(), &full, w, self.vocab_mask.as_ref(), &mut self.logits);
        }
        copy_to_tp_region_forward(&self.ctx, x)?;
        linear_forward(self.backend.as_ref(), x, w, self.vocab_mask.as_ref(), &mut self.logits)
    }

    pub(crate) fn stage_forward(
        &mut self,
        microbatch: usize,
        batch: &Batch,
        input: Option<DeviceTensor>,
        mode: Mode,
    ) -> Result<StageOutput> {
        // Context parallelism: this rank's two sequence chunks of the microbatch.
        let cp_batch;
        let batch = if self.ctx.grid.cp > 1 {
            cp_batch = local_batch(batch, &self.ctx)?;
            &cp_batch
        } else {
            batch
        };
        let (b, s) = (batch.micro_batch_size, batch.seq_length);
        let n = b * s;
        let (first, last) = (self.embedding.is_some(), self.ctx.is_last_stage());
        let bad_tokens = first && batch.tokens.len() != n;
        let bad_labels = last && (batch.labels.len() != n || batch.loss_mask.len() != n);
        if bad_tokens || bad_labels {
            bail!(
                "batch of {b}x{s} has {} tokens, {} labels and {} loss-mask entries; all must be {n}",
                batch.tokens.len(),
                batch.labels.len(),
                batch.loss_mask.len()
            );
        }
        let train = mode == Mode::Train;
        if train && self.stash.contains_key(&microbatch) {
            bail!(
                "microbatch {microbatch} is already in flight on pipeline stage {}; run its backward first",
                self.ctx.pp_rank
            );
        }
        let step = StepInfo { batch: b, seq: s, train, seed: batch.seed };
        let tokens = if first { Some(self.upload_ids(&batch.tokens, "token", self.vocab_padded, None)?) } else { None };
        let input = match (first, input) {
            (true, None) => None,
            (true, Some(_)) => bail!("the first pipeline stage embeds tokens and takes no input activation"),
            (false, None) => {
                bail!("pipeline stage {} needs the previous stage's hidden states (B, T, C) as input", self.ctx.pp_rank)
            }
            (false, Some(x)) => {
                let want = self.decoder.hidden_shape(&step)?;
                if x.shape() != want {
                    bail!(
                        "stage input has shape {:?}, expected {want:?} ((micro batch, sequence, hidden), or the \
                         (tokens/tp, hidden) shard with --sequence-parallel)",
                        x.shape()
                    );
                }
                Some(x)
            }
        };
        // The buffers are overwritten now: move a microbatch still waiting for backward aside.
        self.stash_live()?;
        self.run_forward(tokens.as_ref(), input.as_ref(), &step)?;
        let (output, labels) = if last {
            // Padded ids have probability 0 (masked logits): they can never be counted targets.
            let labels = self.upload_ids(&batch.labels, "label", self.config.vocab_size, Some(&batch.loss_mask))?;
            self.run_logits(&step)?;
            let losses = self.cross_entropy.forward(&self.logits, &labels, self.vocab_start())?;
            let mut report = LossReport::default();
            for (loss, &m) in losses.iter().zip(&batch.loss_mask) {
                if m != 0.0 {
                    report.loss_sum += loss * m as f64;
                    report.num_tokens += m as f64;
                }
            }
            if self.ctx.grid.cp > 1 {
                // Every CP rank reports the whole microbatch (summed in a fixed group order).
                let mut sums = [report.loss_sum, report.num_tokens];
                self.ctx
                    .comm
                    .all_reduce_f64(&self.ctx.cp_group, &mut sums, ReduceOp::Sum)
                    .context("context-parallel sum of the loss report")?;
                report = LossReport { loss_sum: sums[0], num_tokens: sums[1] };
            }
            (StageOutput::Loss(report), Some(labels))
        } else {
            let out = self.decoder.output();
            let mut hidden = self.backend.zeros(out.shape(), out.dtype())?;
            self.backend.copy(out, &mut hidden)?;
            (StageOutput::Hidden(hidden), None)
        };
        if train {
            let loss_mask = if last { batch.loss_mask.clone() } else { Vec::new() };
            self.stash.insert(microbatch, Saved { step, tokens, labels, loss_mask, activations: None });
            self.live = Some(microbatch);
        }
        Ok(output)
    }

    pub(crate) fn stage_backward(
        &mut self,
        microbatch: usize,
        grad_output: Option<DeviceTensor>,
        grad_scale: f32,
        on_grads_ready: GradsReadyHook,
    ) -> Result<Option<DeviceTensor>> {
        let mut saved = self.stash.remove(&microbatch).with_context(|| {
            format!(
                "backward of microbatch {microbatch} on pipeline stage {} without its training forward \
                 (in flight: {:?})",
                self.ctx.pp_rank,
                self.stash.keys().collect::<Vec<_>>()
            )
        })?;
        let step = saved.step;
        let last = self.ctx.is_last_stage();
        self.restore_activations(microbatch, &mut saved)?;
        // The backward consumes the buffers (the logits become d_logits): nothing to keep.
        self.live = None;
        let backend = self.backend.clone();
        let bk = backend.as_ref();
        let received;
        let d_output: &DeviceTensor = if last {
            if grad_output.is_some() {
                bail!("the last pipeline stage starts backward from the loss and takes no output gradient");
            }
            let labels = saved.labels.as_ref().context("the last stage saved no labels")?;
            // x cp: see `crate::context_parallel` (the DP×CP reduction divides by dp·cp).
            let grad_scale = grad_scale * self.ctx.grid.cp as f32;
            let d_loss: Vec<f32> = saved.loss_mask.iter().map(|m| grad_scale * m).collect();
            let d_loss = bk.from_host(megatron_core::HostBuffer::F32(d_loss), &[step.tokens()])?;
            let vocab_start = self.vocab_start();
            self.cross_entropy.backward_inplace(&mut self.logits, labels, vocab_start, &d_loss)?;
            // Output layer backward (the logits buffer now holds d_logits).
            let out = self.decoder.output();
            ensure_buffer(bk, &mut self.d_hidden, out.shape(), out.dtype())?;
            let (w, ready_now) =
                match (self.output_layer.as_mut(), self.shared_embedding.as_mut(), self.embedding.as_mut()) {
                    (Some(p), _, _) | (None, Some(p), _) => (p, true),
                    // Tied on a single stage: the embedding backward adds more, report it there.
                    (None, None, Some(e)) => (&mut e.word_embeddings.weight, false),
                    (None, None, None) => bail!("pipeline stage {} has no output layer", self.ctx.pp_rank),
                };
            let x = self.decoder.output();
            if self.config.sequence_parallel && self.ctx.tp_size() > 1 {
                // SP: gather the input again; the (N, C) input gradient is reduce-scattered
                // back to this rank's token shard.
                let full = gather_lm_input(bk, &self.ctx, x, &step)?;
                let mut d_full = bk.zeros(full.shape(), self.d_hidden.dtype())?; // (N, C)
                linear_backward(bk, &full, &w.value, &self.logits, Some(&mut d_full), &mut w.grad, None)?;
                reduce_scatter_to_sp_region(&self.ctx, &d_full, &mut self.d_hidden)?;
            } else {
                linear_backward(bk, x, &w.value, &self.logits, Some(&mut self.d_hidden), &mut w.grad, None)?;
                copy_to_tp_region_backward(&self.ctx, &mut self.d_hidden)?;
            }
            if ready_now {
                on_grads_ready(&[&*w])?;
            }
            &self.d_hidden
        } else {
            received = grad_output.with_context(|| {
                format!("pipeline stage {} needs the gradient of its output from the next stage", self.ctx.pp_rank)
            })?;
            if received.shape() != self.decoder.output().shape() {
                bail!(
                    "output gradient has shape {:?}, expected {:?} (micro batch, sequence, hidden)",
                    received.shape(),
                    self.decoder.output().shape()
                );
            }
            &received
        };
        let d_input = self.decoder.backward_with_hook(d_output, &step, on_grads_ready)?;
        match self.embedding.as_mut() {
            Some(emb) => {
                let tokens = saved.tokens.as_ref().context("the first stage saved no token ids")?;
                emb.backward(tokens, d_input, &step)?;
                on_grads_ready(&emb.params())?;
                Ok(None)
            }
            None => {
                let mut d_in = bk.zeros(d_input.shape(), d_input.dtype())?;
                copy_any(bk, d_input, &mut d_in)?;
                Ok(Some(d_in))
            }
        }
    }

    /// SPEC §5.10 step 3: with tied embeddings and pp > 1, the first stage's word embedding and
    /// the last stage's copy get the sum of both gradients (collective over the embedding
    /// group; a no-op on middle stages, with untied weights and at pp = 1).
    pub(crate) fn all_reduce_shared_embedding_grad(&mut self) -> Result<()> {
        if self.ctx.pp_size() == 1 || self.config.untie_embeddings_and_output_weights {
            return Ok(());
        }
        let p = match (self.shared_embedding.as_mut(), self.embedding.as_mut()) {
            (Some(p), _) => p,
            (None, Some(e)) => &mut e.word_embeddings.weight,
            (None, None) => return Ok(()),
        };
        let group = &self.ctx.embedding_group;
        self.ctx.comm.all_reduce(group, &mut p.grad, ReduceOp::Sum).with_context(|| {
            format!("all-reduce of the tied word-embedding gradient over the embedding group {:?}", group.ranks)
        })
    }
}
