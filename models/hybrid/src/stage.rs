//! The pipeline-stage forward and backward of [`HybridModel`] (the [`megatron_core::Model`]
//! stage API, SPEC §5.5) and the tied-embedding gradient finalize (SPEC §5.10 step 3).
//!
//! Several training microbatches may be in flight on a stage (1F1B keeps up to `pp − stage`).
//! Each training forward moves what its backward needs out of the modules into a [`Saved`]
//! entry keyed by the microbatch id (handle moves: the layers' [`LayerState`], the logits and
//! the cross-entropy statistics); its backward moves them back.
//!
//! Full recomputation (`--recompute-granularity full`, [`megatron_transformer::recompute`]):
//! the layers of a recompute unit drop their saved tensors right after their forward, and
//! the unit's inner residuals are dropped too; only the unit's input stays. Before the
//! backward of a unit's last layer the unit's forward runs again from that input with the
//! same [`StepInfo`] (same dropout masks; MoE layers told it is a recomputation), so the
//! activations, and so the gradients, are bit-identical to keeping them.

use crate::layers::LayerState;
use crate::model::HybridModel;
use anyhow::{bail, Context, Result};
use megatron_core::{Batch, DeviceTensor, GradsReadyHook, HostBuffer, LossReport, Mode, ReduceOp, StageOutput};
use megatron_transformer::step::{empty, SavedActivations};
use megatron_transformer::tp_mappings::copy_to_tp_region_backward;
use megatron_transformer::{linear_backward, BackwardScratch, StepInfo};
use std::ops::Range;

/// What the backward of one in-flight training microbatch needs.
pub(crate) struct Saved {
    step: StepInfo,
    ids: Option<DeviceTensor>,     // (B*T) int32, first stage
    labels: Option<DeviceTensor>,  // (B*T) int32, last stage
    loss_mask: Vec<f32>,           // (B*T), last stage
    stream: Vec<DeviceTensor>,     // n + 1 tensors (B, T, C): the input of every layer, then the last output
    head_in: Option<DeviceTensor>, // (B, T, C): final norm output, last stage
    layers: Vec<LayerState>,
    logits: Option<DeviceTensor>, // (B, T, V/tp), last stage
    ce: Option<SavedActivations>, // final norm and cross-entropy row statistics, last stage
}

impl HybridModel {
    /// The last stage's buffers besides the layers': final norm and cross-entropy statistics.
    fn head_slots(&mut self) -> Vec<&mut DeviceTensor> {
        let mut v = self.final_norm.as_mut().map(|n| n.saved_activations_mut()).unwrap_or_default();
        v.extend(self.ce.saved_activations_mut());
        v
    }

    /// Embedding (first stage) or the received input, the stage's layers, and on the last
    /// stage the final norm and the logits (`self.logits`). Returns the stream and head input.
    pub(crate) fn run_stage(
        &mut self,
        ids: Option<&DeviceTensor>,
        input: Option<DeviceTensor>,
        step: &StepInfo,
    ) -> Result<(Vec<DeviceTensor>, Option<DeviceTensor>)> {
        let be = self.backend.clone();
        let be = be.as_ref();
        let shape = [step.batch, step.seq, self.config.hidden_size];
        let (res, act) = (self.residual_dtype(), self.config.params_dtype);
        let x = match (self.embedding.as_mut(), ids, input) {
            (Some(emb), Some(ids), None) => {
                let mut x = be.zeros(&shape, res)?;
                emb.forward(ids, &mut x, step)?;
                x
            }
            (None, None, Some(mut x)) => {
                x.reshape(&shape)?;
                x
            }
            _ => bail!("a stage takes token ids on the first pipeline stage and hidden states on the others"),
        };
        let units = self.recompute_units(step);
        let mut stream = vec![x];
        for (i, layer) in self.layers.iter_mut().enumerate() {
            let mut y = be.zeros(&shape, res)?;
            layer.forward(stream.last().unwrap_or_else(|| unreachable!()), &mut y, step)?;
            stream.push(y);
            if let Some(u) = &units[i] {
                drop(layer.take_state()?); // rebuilt by the unit's recompute
                if i > u.start {
                    stream[i] = empty(be)?; // an inner residual of the unit
                }
            }
        }
        let Some(norm) = self.final_norm.as_mut() else { return Ok((stream, None)) };
        let mut head_in = be.zeros(&shape, act)?;
        norm.forward(stream.last().unwrap_or_else(|| unreachable!()), &mut head_in)?;
        self.logits = self.head_logits(&head_in, step.tokens())?;
        self.logits.reshape(&[step.batch, step.seq, self.vocab_padded / self.ctx.tp_size()])?;
        Ok((stream, Some(head_in)))
    }

    pub(crate) fn stage_forward(
        &mut self,
        microbatch: usize,
        batch: &Batch,
        input: Option<DeviceTensor>,
        mode: Mode,
    ) -> Result<StageOutput> {
        let (b, s) = (batch.micro_batch_size, batch.seq_length);
        let n = b * s;
        let (first, last) = (self.embedding.is_some(), self.final_norm.is_some());
        if (first && batch.tokens.len() != n) || (last && (batch.labels.len() != n || batch.loss_mask.len() != n)) {
            bail!("batch of {b}x{s} must have {n} tokens, labels and loss-mask entries");
        }
        match (&input, first) {
            (Some(_), true) => bail!("the first pipeline stage embeds tokens and takes no input activation"),
            (None, false) => {
                bail!("pipeline stage {} needs the previous stage's hidden states (B, T, C) as input", self.ctx.pp_rank)
            }
            (Some(x), false) if x.numel() != n * self.config.hidden_size => {
                bail!("stage input has shape {:?}, expected ({b}, {s}, {})", x.shape(), self.config.hidden_size)
            }
            _ => {}
        }
        let train = mode == Mode::Train;
        if train && self.ctx.pp_size() > 1 && self.stash.contains_key(&microbatch) {
            bail!(
                "microbatch {microbatch} is already in flight on pipeline stage {}; run its backward first",
                self.ctx.pp_rank
            );
        }
        let step = StepInfo { batch: b, seq: s, train, seed: batch.seed };
        let ids = if first { Some(self.ids(&batch.tokens, "token", self.vocab_padded, None)?) } else { None };
        let (stream, head_in) = self.run_stage(ids.as_ref(), input, &step)?;
        let (output, labels) = if last {
            let labels = self.ids(&batch.labels, "label", self.config.vocab_size, Some(&batch.loss_mask))?;
            let losses = self.ce.forward(&self.logits, &labels, self.vocab_start())?;
            let mut report = LossReport::default();
            for (l, &m) in losses.iter().zip(&batch.loss_mask) {
                if m != 0.0 {
                    report.loss_sum += l * m as f64;
                    report.num_tokens += m as f64;
                }
            }
            (StageOutput::Loss(report), Some(labels))
        } else {
            let out = stream.last().unwrap_or_else(|| unreachable!());
            let mut hidden = self.backend.zeros(out.shape(), out.dtype())?;
            self.backend.copy(out, &mut hidden)?;
            (StageOutput::Hidden(hidden), None)
        };
        if train {
            let be = self.backend.clone();
            let layers = self.layers.iter_mut().map(|l| l.take_state()).collect::<Result<Vec<_>>>()?;
            let (logits, ce) = if last {
                let slots = self.head_slots();
                let mut set = SavedActivations::placeholders(be.as_ref(), slots.len())?;
                set.swap_with(slots)?;
                (Some(std::mem::replace(&mut self.logits, empty(be.as_ref())?)), Some(set))
            } else {
                (None, None)
            };
            let loss_mask = if last { batch.loss_mask.clone() } else { Vec::new() };
            // pp = 1 (`Model::forward`): a new forward replaces whatever was saved.
            self.stash.insert(microbatch, Saved { step, ids, labels, loss_mask, stream, head_in, layers, logits, ce });
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
        let mut s = self.stash.remove(&microbatch).with_context(|| {
            format!(
                "{} backward of microbatch {microbatch} on pipeline stage {} without its training forward",
                self.name, self.ctx.pp_rank
            )
        })?;
        let be = self.backend.clone();
        let be = be.as_ref();
        for (layer, state) in self.layers.iter_mut().zip(s.layers) {
            layer.put_state(state)?;
        }
        let n = self.layers.len();
        let mut d_res = if self.final_norm.is_some() {
            if grad_output.is_some() {
                bail!("the last pipeline stage starts backward from the loss and takes no output gradient");
            }
            let (Some(mut logits), Some(mut ce), Some(labels), Some(head_in)) = (s.logits, s.ce, s.labels, s.head_in)
            else {
                bail!("the last stage saved no logits/labels for microbatch {microbatch}");
            };
            ce.swap_with(self.head_slots())?;
            let d_loss: Vec<f32> = s.loss_mask.iter().map(|m| m * grad_scale).collect();
            let d_loss = be.from_host(HostBuffer::F32(d_loss), &[s.step.tokens()])?;
            self.ce.backward_inplace(&mut logits, &labels, self.vocab_start(), &d_loss)?;
            let mut d_head = be.zeros(head_in.shape(), head_in.dtype())?;
            let (w, ready_now) =
                match (self.output_layer.as_mut(), self.shared_embedding.as_mut(), self.embedding.as_mut()) {
                    (Some(p), _, _) | (None, Some(p), _) => (p, true),
                    // Tied on a single stage: the embedding backward adds more; reported there.
                    (None, None, Some(e)) => (&mut e.word_embeddings.weight, false),
                    (None, None, None) => bail!("pipeline stage {} has no output layer", self.ctx.pp_rank),
                };
            linear_backward(be, &head_in, &w.value, &logits, Some(&mut d_head), &mut w.grad, None)?;
            copy_to_tp_region_backward(&self.ctx, &mut d_head)?;
            if ready_now {
                on_grads_ready(&[&*w])?;
            }
            let mut d_res = be.zeros(head_in.shape(), self.residual_dtype())?;
            let norm = self.final_norm.as_mut().context("last stage without final norm")?;
            norm.backward(&d_head, &s.stream[n], &mut d_res)?;
            on_grads_ready(&norm.params())?;
            d_res
        } else {
            let mut g = grad_output.with_context(|| {
                format!("pipeline stage {} needs the gradient of its output from the next stage", self.ctx.pp_rank)
            })?;
            if g.numel() != s.stream[n].numel() {
                bail!("output gradient has shape {:?}, expected {:?}", g.shape(), s.stream[n].shape());
            }
            g.reshape(s.stream[n].shape())?;
            g
        };
        let mut scratch = BackwardScratch::new(be)?;
        let units = self.recompute_units(&s.step);
        for i in (0..n).rev() {
            if let Some(u) = units[i].clone().filter(|u| i + 1 == u.end) {
                self.recompute_unit(u, &mut s.stream, &s.step)?;
            }
            let layer = &mut self.layers[i];
            layer.backward(
                &s.stream[i],
                &mut d_res,
                &mut scratch.d_branch,
                &mut scratch.d_norm,
                &mut scratch.inner,
                &s.step,
            )?;
            on_grads_ready(&layer.params())?;
            if let Some(u) = &units[i] {
                // Done with the recomputed tensors: at most one unit's worth is held.
                drop(layer.take_state()?);
                if i > u.start {
                    s.stream[i] = empty(be)?;
                }
            }
        }
        match (self.embedding.as_mut(), s.ids) {
            (Some(emb), Some(ids)) => {
                emb.backward(&ids, &d_res, &s.step)?;
                on_grads_ready(&emb.params())?;
                Ok(None)
            }
            (None, None) => Ok(Some(d_res)),
            _ => bail!("stage {}: token ids saved on a stage without embedding (or missing)", self.ctx.pp_rank),
        }
    }

    /// For each layer of this stage, its recompute unit in a training step (all `None` otherwise).
    fn recompute_units(&self, step: &StepInfo) -> Vec<Option<Range<usize>>> {
        match self.config.recompute.filter(|_| step.train) {
            Some(r) => r.unit_of_layers(self.layers.len()),
            None => vec![None; self.layers.len()],
        }
    }

    /// Re-runs the forward of the layers of `unit` from its kept input `stream[unit.start]`,
    /// refilling their saved tensors and the unit's inner residuals for their backward.
    fn recompute_unit(&mut self, unit: Range<usize>, stream: &mut [DeviceTensor], step: &StepInfo) -> Result<()> {
        let be = self.backend.clone();
        for j in unit.clone() {
            let mut y = be.zeros(stream[j].shape(), stream[j].dtype())?;
            let layer = &mut self.layers[j];
            layer.set_recomputing(true)?;
            let run = layer.forward(&stream[j], &mut y, step);
            layer.set_recomputing(false)?;
            run?;
            if j + 1 < unit.end {
                stream[j + 1] = y;
            }
        }
        Ok(())
    }

    /// SPEC §5.10 step 3: with tied embeddings and pp > 1, the first stage's word embedding and
    /// the last stage's copy get the sum of both gradients (a no-op elsewhere).
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
