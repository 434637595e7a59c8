//! The encoder half of [`BertModel`]: the batch checks, embeddings (word + position + token
//! type, the post-LN embedding LayerNorm, dropout) → this stage's encoder layers → the final
//! LayerNorm (pre-LN), and the backward of all of it; the finetuning entry points
//! [`BertModel::forward_encoder`] / [`BertModel::backward_encoder`].

use super::{BertBatch, BertModel, Encoded};
use anyhow::{bail, Context, Result};
use megatron_core::{DeviceTensor, HostBuffer, Mode};
use megatron_transformer::layer::hidden_dropout;
use megatron_transformer::step::{copy_any, empty, ensure_buffer};
use megatron_transformer::{DropoutSite, NormLayer, StepInfo};

impl BertModel {
    pub(super) fn check_batch(&self, x: &BertBatch) -> Result<()> {
        let n = x.batch * x.seq;
        if x.tokens.len() != n || x.labels.len() != n || x.loss_mask.len() != n || x.types.len() != n {
            bail!(
                "bert batch of {}x{} has {} tokens, {} types, {} labels, {} loss-mask entries; all must be {n}",
                x.batch,
                x.seq,
                x.tokens.len(),
                x.types.len(),
                x.labels.len(),
                x.loss_mask.len()
            );
        }
        if x.lengths.len() != x.batch || x.lengths.iter().any(|&l| l == 0 || l > x.seq) {
            bail!(
                "bert batch: lengths {:?} must give every one of the {} rows 1..={} real tokens",
                x.lengths,
                x.batch,
                x.seq
            );
        }
        if self.binary_head.is_some() && x.is_random.len() != x.batch {
            bail!(
                "bert batch: {} is_random labels for {} rows (the binary head needs one per row)",
                x.is_random.len(),
                x.batch
            );
        }
        if x.seq > self.config.max_position_embeddings {
            bail!("sequence length {} > max_position_embeddings {}", x.seq, self.config.max_position_embeddings);
        }
        for (i, &id) in x.tokens.iter().enumerate() {
            if id < 0 || id as usize >= self.config.vocab_size {
                bail!("token id {id} at position {i} is outside the vocabulary [0, {})", self.config.vocab_size);
            }
        }
        let types = self.config.num_tokentypes.max(1) as i32;
        if let Some(bad) = x.types.iter().find(|&&t| t < 0 || t >= types) {
            bail!("token type {bad} is outside [0, {types}) (num_tokentypes = {})", self.config.num_tokentypes);
        }
        for (i, (&l, &m)) in x.labels.iter().zip(&x.loss_mask).enumerate() {
            if m != 0.0 && (l < 0 || l as usize >= self.config.vocab_size) {
                bail!("label {l} at masked position {i} is outside the vocabulary [0, {})", self.config.vocab_size);
            }
        }
        Ok(())
    }

    /// Embeddings → encoder layers → (final LayerNorm) into `self.hidden` `(B, T, C)`.
    pub(super) fn encode(&mut self, x: &BertBatch, mode: Mode) -> Result<Encoded> {
        self.encode_stage(x, mode, None)
    }

    /// [`Self::encode`] of one pipeline stage: the embeddings on the first stage, else
    /// `input (B, T, C)` (the previous stage's output); `self.hidden` is this stage's output
    /// (after the final LayerNorm on the last stage).
    pub(crate) fn encode_stage(&mut self, x: &BertBatch, mode: Mode, input: Option<&DeviceTensor>) -> Result<Encoded> {
        self.check_batch(x)?;
        self.saved = None;
        self.enc_saved = None;
        let step = StepInfo { batch: x.batch, seq: x.seq, train: mode == Mode::Train, seed: x.seed };
        let backend = self.backend.clone();
        let bk = backend.as_ref();
        let (h, dt) = (self.config.hidden_size, self.config.params_dtype);
        let shape = [x.batch, x.seq, h];
        for t in self.residuals.iter_mut().chain([
            &mut self.emb,
            &mut self.hidden,
            &mut self.lm_dense,
            &mut self.lm_act,
            &mut self.lm_norm,
            &mut self.d_a,
            &mut self.d_b,
        ]) {
            ensure_buffer(bk, t, &shape, dt)?;
        }
        let ids = self.upload_i32(&x.tokens)?;
        let types = self.upload_i32(&x.types)?;
        let lengths = self.upload_i32(&x.lengths.iter().map(|&l| l as i32).collect::<Vec<_>>())?;
        match (self.embedding.as_mut(), input) {
            (Some(embedding), None) => {
                // Embeddings: word + position (+ type), (LayerNorm,) dropout.
                embedding.forward(&ids, &mut self.emb, &step)?;
                if let Some(tt) = &self.tokentype_embeddings {
                    bk.embedding_forward(&types, &tt.value, 0, &mut self.emb, true)?;
                }
                match self.embedding_layernorm.as_mut() {
                    Some(ln) => ln.forward(&self.emb, &mut self.residuals[0])?,
                    None => bk.copy(&self.emb, &mut self.residuals[0])?,
                }
                let p = self.config.hidden_dropout;
                hidden_dropout(bk, &mut self.residuals[0], p, 0, DropoutSite::Embedding, &step)?;
            }
            (None, Some(input)) => {
                if input.shape() != shape {
                    bail!(
                        "bert stage input has shape {:?}, expected {shape:?} (batch, sequence, hidden)",
                        input.shape()
                    );
                }
                copy_any(bk, input, &mut self.residuals[0])?;
            }
            _ => bail!(
                "bert pipeline stage {}: the first stage embeds tokens, every other stage takes the previous \
                 stage's hidden states",
                self.ctx.pp_rank
            ),
        }
        // Full recomputation: after a unit's forward its layers free their activations and
        // only the unit's input (and output, the next unit's input) stays in `residuals`.
        let units = match self.config.recompute {
            Some(r) if step.train => r.units(self.layers.len()),
            _ => Vec::new(),
        };
        for l in 0..self.layers.len() {
            let (done, rest) = self.residuals.split_at_mut(l + 1);
            self.layers[l].forward(&done[l], &lengths, &mut rest[0], &step)?;
            if let Some(u) = units.iter().find(|u| u.end == l + 1) {
                for k in u.clone() {
                    self.layers[k].drop_saved()?;
                }
                for k in u.start + 1..u.end {
                    self.residuals[k] = empty(bk)?;
                }
            }
        }
        let last = &self.residuals[self.layers.len()];
        match self.final_layernorm.as_mut() {
            Some(ln) => ln.forward(last, &mut self.hidden)?,
            None => bk.copy(last, &mut self.hidden)?,
        }
        Ok(Encoded { step, ids, types, lengths })
    }

    /// The encoder alone (no LM or binary head; finetuning heads read
    /// [`Self::hidden_states`]); in [`Mode::Train`] keeps what [`Self::backward_encoder`] needs.
    pub fn forward_encoder(&mut self, x: &BertBatch, mode: Mode) -> Result<()> {
        let enc = self.encode(x, mode)?;
        if enc.step.train {
            self.enc_saved = Some(enc);
        }
        Ok(())
    }

    /// Backpropagates `d_hidden (B, T, C)` (host values) through the saved encoder forward.
    pub fn backward_encoder(&mut self, d_hidden: Vec<f32>) -> Result<()> {
        let enc = self.enc_saved.take().context("BertModel::backward_encoder without a training forward_encoder")?;
        let d = self.backend.from_host(HostBuffer::F32(d_hidden), self.hidden.shape())?;
        self.d_b = self.to_act(d)?;
        self.backward_from_hidden(&enc)
    }

    /// The encoder's backward from `d hidden` in `self.d_b` `(B, T, C)`.
    pub(super) fn backward_from_hidden(&mut self, enc: &Encoded) -> Result<()> {
        let backend = self.backend.clone();
        let bk = backend.as_ref();
        // Encoder: d_a becomes the residual-stream gradient.
        let last = &self.residuals[self.layers.len()];
        match self.final_layernorm.as_mut() {
            Some(ln) => ln.backward(&self.d_b, last, &mut self.d_a)?,
            None => bk.copy(&self.d_b, &mut self.d_a)?,
        }
        self.backward_layers(enc)
    }

    /// The backward of this stage's layers from the residual-stream gradient in `self.d_a`
    /// `(B, T, C)`, then of the embeddings on the first stage; elsewhere `self.d_a` is left
    /// holding the gradient of the stage input.
    pub(crate) fn backward_layers(&mut self, enc: &Encoded) -> Result<()> {
        let step = enc.step;
        let backend = self.backend.clone();
        let bk = backend.as_ref();
        let units = self.config.recompute.map(|r| r.units(self.layers.len())).unwrap_or_default();
        for l in (0..self.layers.len()).rev() {
            if let Some(u) = units.iter().find(|u| u.end == l + 1) {
                // Re-run the unit's forward from its kept input (same step: same dropout
                // masks, bit-identical activations).
                for k in u.clone() {
                    let (done, rest) = self.residuals.split_at_mut(k + 1);
                    ensure_buffer(bk, &mut rest[0], done[k].shape(), done[k].dtype())?;
                    self.layers[k].forward(&done[k], &enc.lengths, &mut rest[0], &step)?;
                }
            }
            self.layers[l].backward(&self.residuals[l], &enc.lengths, &mut self.d_a, &mut self.scratch, &step)?;
        }
        let Some(embedding) = self.embedding.as_mut() else {
            return Ok(());
        };
        // Embeddings.
        hidden_dropout(bk, &mut self.d_a, self.config.hidden_dropout, 0, DropoutSite::Embedding, &step)?;
        let d_emb = match self.embedding_layernorm.as_mut() {
            Some(ln) => {
                ln.backward(&self.d_a, &self.emb, &mut self.d_b)?;
                &self.d_b
            }
            None => &self.d_a,
        };
        if let Some(tt) = self.tokentype_embeddings.as_mut() {
            bk.embedding_backward(&enc.types, d_emb, 0, &mut tt.grad)?;
        }
        embedding.backward(&enc.ids, d_emb, &step)
    }
}
