//! BERT as pipeline stages (SPEC §5.5, the [`megatron_core::Model`] stage API): the stage
//! forward/backward and the tied-embedding gradient sum. Which layers a stage holds is
//! [`crate::BertConfig::stage_layers`] (even, or Megatron's uneven first/last split).
//!
//! Every stage receives the whole microbatch from the schedule (it needs the padding lengths;
//! the last stage the labels and `is_random`). A stage keeps ONE set of activations in its
//! module buffers; with several microbatches in flight (1F1B) a backward whose activations
//! were overwritten by a later forward recomputes its stage forward first from the kept
//! input (Megatron's full activation recomputation, one extra stage forward): the dropout
//! masks are a function of the microbatch seed and the global layer number, so the
//! recomputed activations are the original ones bit for bit. The last stage runs each
//! backward right after its forward and never recomputes.

use crate::model::{BertBatch, BertLosses, BertModel};
use anyhow::{bail, Context, Result};
use megatron_core::{Batch, DeviceTensor, GradsReadyHook, LossReport, Mode, ReduceOp, StageOutput};

/// What one stage's forward gives: the losses (last stage) or its output hidden states.
enum StageRun {
    Losses(BertLosses),
    Hidden(DeviceTensor),
}

/// One in-flight training microbatch of a stage.
pub(crate) struct InFlight {
    x: BertBatch,
    /// The previous stage's output (every stage but the first), kept for a recompute.
    input: Option<DeviceTensor>,
    /// Last stage: the loss sums (the backward's scales).
    losses: BertLosses,
}

impl BertModel {
    /// A schedule's [`Batch`] as a [`BertBatch`] (packed samples with `seq_length` set).
    pub(crate) fn batch_of(&self, b: &Batch) -> Result<BertBatch> {
        match self.config.seq_length {
            Some(seq) => BertBatch::unpack(b, seq),
            None => Ok(self.bert_batch(b)),
        }
    }

    /// The loss report of one microbatch's losses (see the crate docs); records the `sop
    /// loss` (averaged over data-parallel ranks): a training forward's for
    /// `Model::take_metrics`, an evaluation forward's for `Model::take_eval_metrics`.
    pub(crate) fn report(&mut self, l: BertLosses, mode: Mode) -> Result<LossReport> {
        if self.config.seq_length.is_none() {
            return Ok(LossReport { loss_sum: l.lm_loss_sum, num_tokens: l.lm_tokens });
        }
        if self.binary_head.is_some() {
            // Megatron logs the sop loss averaged over the data-parallel group; every DP rank
            // runs the same number of training (and of evaluation) forwards, so this
            // collective pairs up.
            let ctx = self.ctx();
            let mut sop = [l.sop_loss_sum / l.sop_rows.max(1.0)];
            ctx.comm.all_reduce_f64(&ctx.dp_group, &mut sop, ReduceOp::Sum)?;
            let sop = sop[0] / ctx.dp_size() as f64;
            let sink = if mode == Mode::Train { &mut self.metrics } else { &mut self.eval_metrics };
            sink.push(("sop loss".to_string(), sop));
        }
        Ok(LossReport { loss_sum: l.lm_loss_sum / l.lm_tokens.max(1.0), num_tokens: 1.0 })
    }

    /// `(lm_scale, sop_scale)` of [`BertModel::backward_bert`] for the schedule's `grad_scale`.
    pub(crate) fn scales(&self, l: &BertLosses, grad_scale: f32) -> (f32, f32) {
        if self.config.seq_length.is_none() {
            return (grad_scale, 0.0);
        }
        // d(lm + sop)/d(per-token ce) = scale/Σmask at masked positions; per-row sop: scale/rows.
        let (lm, sop) = (grad_scale as f64 / l.lm_tokens.max(1.0), grad_scale as f64 / l.sop_rows.max(1.0));
        (lm as f32, sop as f32)
    }

    /// This stage's forward of `x`: the losses on the last stage, else the output hidden
    /// states (the module buffers keep what the backward needs in [`Mode::Train`]).
    fn run_stage(&mut self, x: &BertBatch, input: Option<&DeviceTensor>, mode: Mode) -> Result<StageRun> {
        if self.ctx().is_last_stage() {
            return Ok(StageRun::Losses(self.forward_bert_stage(x, mode, input)?));
        }
        let enc = self.encode_stage(x, mode, input)?;
        if mode == Mode::Train {
            self.enc_saved = Some(enc);
        }
        let out = self.hidden_states();
        let mut hidden = self.backend().zeros(out.shape(), self.act_dtype())?;
        self.backend().copy(out, &mut hidden)?;
        Ok(StageRun::Hidden(hidden))
    }

    /// [`megatron_core::Model::forward_stage`] with pp > 1.
    pub(crate) fn stage_forward(
        &mut self,
        microbatch: usize,
        batch: &Batch,
        input: Option<DeviceTensor>,
        mode: Mode,
    ) -> Result<StageOutput> {
        let x = self.batch_of(batch)?;
        if mode == Mode::Train && self.stage_stash.contains_key(&microbatch) {
            bail!("microbatch {microbatch} is already in flight on bert pipeline stage {}", self.ctx().pp_rank);
        }
        let out = self.run_stage(&x, input.as_ref(), mode)?;
        let (output, losses) = match out {
            StageRun::Losses(l) => (StageOutput::Loss(self.report(l, mode)?), l),
            StageRun::Hidden(h) => (StageOutput::Hidden(h), BertLosses::default()),
        };
        // The buffers now hold this forward's activations (an eval forward's: nobody's).
        self.stage_live = None;
        if mode == Mode::Train {
            self.stage_stash.insert(microbatch, InFlight { x, input, losses });
            self.stage_live = Some(microbatch);
        }
        Ok(output)
    }

    /// [`megatron_core::Model::backward_stage`] with pp > 1.
    pub(crate) fn stage_backward(
        &mut self,
        microbatch: usize,
        grad_output: Option<DeviceTensor>,
        grad_scale: f32,
        on_grads_ready: GradsReadyHook,
    ) -> Result<Option<DeviceTensor>> {
        let f = self.stage_stash.remove(&microbatch).with_context(|| {
            format!(
                "backward of microbatch {microbatch} on bert pipeline stage {} without its training forward",
                self.ctx().pp_rank
            )
        })?;
        if self.stage_live != Some(microbatch) {
            // A later forward overwrote the buffers: recompute this microbatch's (same masks).
            let _recomputed = self.run_stage(&f.x, f.input.as_ref(), Mode::Train)?;
        }
        self.stage_live = None;
        let last = self.ctx().is_last_stage();
        match (last, grad_output) {
            (true, None) => {
                let (lm, sop) = self.scales(&f.losses, grad_scale);
                self.backward_bert(lm, sop)?;
            }
            (false, Some(d)) => {
                let enc = self.enc_saved.take().context("bert stage backward without a saved forward")?;
                if d.shape() != self.hidden_states().shape() {
                    bail!(
                        "output gradient has shape {:?}, expected {:?} (batch, sequence, hidden)",
                        d.shape(),
                        self.hidden_states().shape()
                    );
                }
                megatron_transformer::step::copy_any(self.backend().as_ref(), &d, &mut self.d_a)?;
                self.backward_layers(&enc)?;
            }
            (true, Some(_)) => bail!("the last bert pipeline stage starts backward from the loss"),
            (false, None) => bail!("bert pipeline stage {} needs the gradient of its output", self.ctx().pp_rank),
        }
        on_grads_ready(&self.params())?;
        if self.embedding.is_some() {
            return Ok(None);
        }
        let mut d_in = self.backend().zeros(self.d_a.shape(), self.act_dtype())?;
        self.backend().copy(&self.d_a, &mut d_in)?;
        Ok(Some(d_in))
    }

    /// The `(B, T, C)` activation a stage receives for `batch`.
    pub(crate) fn stage_shape(&self, batch: &Batch) -> Vec<usize> {
        let seq = self.config.seq_length.unwrap_or(batch.seq_length);
        vec![batch.micro_batch_size, seq, self.config.hidden_size]
    }

    /// SPEC §5.10 step 3: the first stage's word embedding and the last stage's copy get the
    /// sum of both gradients (over the embedding group; nothing to do at pp = 1 or in between).
    pub(crate) fn all_reduce_shared_embedding_grad(&mut self) -> Result<()> {
        if self.ctx().pp_size() == 1 {
            return Ok(());
        }
        let ctx = self.ctx().clone();
        let p = match (self.shared_embedding.as_mut(), self.embedding.as_mut()) {
            (Some(p), _) => p,
            (None, Some(e)) => &mut e.word_embeddings.weight,
            (None, None) => return Ok(()),
        };
        ctx.comm.all_reduce(&ctx.embedding_group, &mut p.grad, ReduceOp::Sum).with_context(|| {
            format!(
                "all-reduce of the tied word-embedding gradient over the embedding group {:?}",
                ctx.embedding_group.ranks
            )
        })
    }

    /// A whole-model call on one stage of several is refused with the fix.
    pub(crate) fn require_whole_model(&self, what: &str) -> Result<()> {
        if self.ctx().pp_size() > 1 {
            bail!(
                "BertModel::{what} runs the whole model, but this is pipeline stage {} of {}; pipelined runs go \
                 through a pipeline schedule (`1f1b`) and the stage API",
                self.ctx().pp_rank,
                self.ctx().pp_size()
            );
        }
        Ok(())
    }
}
