//! BERT's pretraining losses on the last stage: the LM head (dense → GeLU → LayerNorm → the
//! projection tied to the word embedding + `output_bias`, vocab-parallel cross entropy over
//! the masked positions) and the binary head's sentence-order loss, forward
//! ([`BertModel::forward_bert`]) and backward ([`BertModel::backward_bert`]).

use super::{BertBatch, BertLosses, BertModel, Saved};
use crate::heads::sop_cross_entropy;
use anyhow::{bail, Context, Result};
use megatron_core::{DeviceTensor, HostBuffer, Mode};
use megatron_transformer::linear::{linear_backward, linear_forward};
use megatron_transformer::step::ensure_buffer;
use megatron_transformer::tp_mappings::{copy_to_tp_region_backward, copy_to_tp_region_forward};
use megatron_transformer::NormLayer;

impl BertModel {
    /// Runs one microbatch; in [`Mode::Train`] keeps what [`Self::backward_bert`] needs.
    pub fn forward_bert(&mut self, x: &BertBatch, mode: Mode) -> Result<BertLosses> {
        self.forward_bert_stage(x, mode, None)
    }

    /// [`Self::forward_bert`] of the last pipeline stage (`input` from the previous stage).
    pub(crate) fn forward_bert_stage(
        &mut self,
        x: &BertBatch,
        mode: Mode,
        input: Option<&DeviceTensor>,
    ) -> Result<BertLosses> {
        if !self.ctx.is_last_stage() {
            bail!("bert: the losses are computed on the last pipeline stage, not on stage {}", self.ctx.pp_rank);
        }
        let enc = self.encode_stage(x, mode, input)?;
        let step = enc.step;
        let backend = self.backend.clone();
        let bk = backend.as_ref();
        // LM head.
        linear_forward(
            bk,
            &self.hidden,
            &self.lm_dense_weight.value,
            Some(&self.lm_dense_bias.value),
            &mut self.lm_dense,
        )?;
        crate::mlp::gelu_forward(bk, self.config.gelu_erf, &self.lm_dense, &mut self.lm_act)?;
        self.lm_layernorm.forward(&self.lm_act, &mut self.lm_norm)?;
        let local = self.vocab_padded / self.ctx.tp_size();
        // Logits in the activation dtype (as the GPT's); the cross entropy widens them and
        // keeps its row statistics and the per-token losses in fp32.
        ensure_buffer(bk, &mut self.logits, &[x.batch, x.seq, local], self.config.params_dtype)?;
        let bias: Vec<f32> = bk
            .to_host(&self.output_bias.value)?
            .to_f32_vec()
            .iter()
            .zip(&self.vocab_mask)
            .map(|(b, m)| b + m)
            .collect();
        let bias = bk.from_host(HostBuffer::F32(bias), &[local])?;
        copy_to_tp_region_forward(&self.ctx, &self.lm_norm)?;
        let w = match (&self.shared_embedding, &self.embedding) {
            (Some(p), _) => &p.value,
            (None, Some(e)) => &e.word_embeddings.weight.value,
            (None, None) => bail!("bert pipeline stage {} holds no word embedding", self.ctx.pp_rank),
        };
        linear_forward(bk, &self.lm_norm, w, Some(&bias), &mut self.logits)?;
        // Unmasked positions get target 0 (never counted: their loss mask is 0).
        let targets: Vec<i32> =
            x.labels.iter().zip(&x.loss_mask).map(|(&l, &m)| if m != 0.0 { l } else { 0 }).collect();
        let labels = self.upload_i32(&targets)?;
        let vocab_start = self.vocab_start();
        let losses = self.cross_entropy.forward(&self.logits, &labels, vocab_start)?;
        let mut out = BertLosses::default();
        for (loss, &m) in losses.iter().zip(&x.loss_mask) {
            if m != 0.0 {
                out.lm_loss_sum += loss * m as f64;
                out.lm_tokens += m as f64;
            }
        }
        let mut sop_logits = Vec::new();
        if let Some(head) = self.binary_head.as_mut() {
            let hidden = bk.to_host(&self.hidden)?.to_f32_vec();
            sop_logits = head.forward(bk, &hidden, x.batch, x.seq)?;
            let (sum, count, _) = sop_cross_entropy(&sop_logits, &x.is_random);
            out.sop_loss_sum = sum;
            out.sop_rows = count;
        }
        if step.train {
            self.saved =
                Some(Saved { enc, labels, loss_mask: x.loss_mask.clone(), is_random: x.is_random.clone(), sop_logits });
        }
        Ok(out)
    }

    /// Backpropagates the saved microbatch with `d loss / d per-token lm loss = lm_scale ·
    /// loss_mask` and `d loss / d per-row sop loss = sop_scale`, accumulating every gradient.
    pub fn backward_bert(&mut self, lm_scale: f32, sop_scale: f32) -> Result<()> {
        let saved = self.saved.take().context("BertModel::backward without a preceding training forward")?;
        let step = saved.enc.step;
        let backend = self.backend.clone();
        let bk = backend.as_ref();
        // Output layer (tied to the word embedding) and its bias.
        let d_loss: Vec<f32> = saved.loss_mask.iter().map(|m| lm_scale * m).collect();
        let d_loss = bk.from_host(HostBuffer::F32(d_loss), &[step.tokens()])?;
        let vocab_start = self.vocab_start();
        self.cross_entropy.backward_inplace(&mut self.logits, &saved.labels, vocab_start, &d_loss)?;
        let we = match (self.shared_embedding.as_mut(), self.embedding.as_mut()) {
            (Some(p), _) => p,
            (None, Some(e)) => &mut e.word_embeddings.weight,
            (None, None) => bail!("bert pipeline stage {} holds no word embedding", self.ctx.pp_rank),
        };
        linear_backward(
            bk,
            &self.lm_norm,
            &we.value,
            &self.logits,
            Some(&mut self.d_a),
            &mut we.grad,
            Some(&mut self.output_bias.grad),
        )?;
        copy_to_tp_region_backward(&self.ctx, &mut self.d_a)?;
        // LayerNorm → GeLU → dense.
        self.lm_layernorm.backward(&self.d_a, &self.lm_act, &mut self.d_b)?;
        crate::mlp::gelu_backward(bk, self.config.gelu_erf, &self.lm_dense, &self.d_b, &mut self.d_a)?;
        let (w, g, bg) = (&self.lm_dense_weight.value, &mut self.lm_dense_weight.grad, &mut self.lm_dense_bias.grad);
        linear_backward(bk, &self.hidden, w, &self.d_a, Some(&mut self.d_b), g, Some(bg))?;
        // Binary head: its gradient enters at the first token of every row.
        if let Some(head) = self.binary_head.as_mut() {
            let (_, _, d) = sop_cross_entropy(&saved.sop_logits, &saved.is_random);
            let d_cls = head.backward(bk, d.iter().map(|v| v * sop_scale).collect())?;
            let mut d_hidden = bk.to_host(&self.d_b)?.to_f32_vec();
            let c = self.config.hidden_size;
            for r in 0..step.batch {
                let row = &mut d_hidden[r * step.seq * c..r * step.seq * c + c];
                row.iter_mut().zip(&d_cls[r * c..(r + 1) * c]).for_each(|(a, b)| *a += b);
            }
            let d = bk.from_host(HostBuffer::F32(d_hidden), self.hidden.shape())?;
            self.d_b = self.to_act(d)?;
        }
        self.backward_from_hidden(&saved.enc)
    }
}
