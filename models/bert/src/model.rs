//! [`BertModel`] (SPEC §4.8): embeddings (word + position + token type) → encoder layers with
//! key-padding-mask attention → (final LayerNorm, pre-LN) → LM head and binary head, with
//! explicit forward and backward. The linears are Megatron's TP layers, the logits
//! vocab-parallel. With pipeline parallelism one object is one stage ([`crate::stage`]): the
//! first stage holds the embeddings, every stage its share of the encoder layers (global
//! numbering, so names and dropout streams do not depend on the split), the last stage the
//! final LayerNorm, the heads and a copy of the tied word embedding (`shared_copy`). The
//! LM head's small dense/LayerNorm/bias tensors (`h² + 3h + V/tp` floats) are built on every
//! stage but belong to (and are reported by) the last stage only.
//!
//! Loss (`pretrain_bert.py`): `lm loss = Σ ce·loss_mask / Σ loss_mask` and, with the binary
//! head, `sop loss = mean over rows of ce(binary_logits, is_random)`; the total is their sum.
//! [`BertModel::forward_bert`] returns both sums and counts; [`BertModel::backward_bert`]
//! takes the two scales (`1/Σ loss_mask` and `1/rows` for the mean losses).

use crate::config::{BertConfig, LayerNormPlacement};
use crate::heads::{sop_cross_entropy, BinaryHead};
use crate::layer::BertLayer;
use anyhow::{bail, Context, Result};
use megatron_core::{Backend, DType, DeviceTensor, HostBuffer, Mode, ParallelContext, Param};
use megatron_transformer::layer::hidden_dropout;
use megatron_transformer::linear::{linear_backward, linear_forward};
use megatron_transformer::step::{empty, ensure_shape};
use megatron_transformer::tp_mappings::{copy_to_tp_region_backward, copy_to_tp_region_forward};
use megatron_transformer::{
    BackwardScratch, DropoutSite, Init, LanguageModelEmbedding, LayerNorm, LocalSpecProvider, ModuleBuilder, NormLayer,
    SpecProvider, Split, StepInfo, VocabParallelCrossEntropy,
};
use std::sync::Arc;

/// One BERT microbatch, `(B, T)` row-major (Megatron's `text`, `types`, `labels`,
/// `loss_mask`, `padding_mask` as per-row lengths, `is_random`).
#[derive(Clone, Debug, PartialEq)]
pub struct BertBatch {
    pub batch: usize,
    pub seq: usize,
    pub tokens: Vec<i32>,
    /// Token types (0 for `[CLS] A [SEP]`, 1 for `B [SEP]`); ignored without token types.
    pub types: Vec<i32>,
    /// Real tokens per row (`padding_mask` is 1 on `[0, len)`).
    pub lengths: Vec<usize>,
    /// Original ids at masked positions (anything elsewhere: not counted).
    pub labels: Vec<i32>,
    pub loss_mask: Vec<f32>,
    /// Sentence-order label per row (1 = swapped), −1 = ignored.
    pub is_random: Vec<i32>,
    /// Root of this microbatch's dropout masks.
    pub seed: u64,
}

/// The loss sums of one microbatch.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BertLosses {
    pub lm_loss_sum: f64,
    pub lm_tokens: f64,
    pub sop_loss_sum: f64,
    pub sop_rows: f64,
}

/// What the encoder's backward needs besides the module buffers.
pub(crate) struct Encoded {
    step: StepInfo,
    ids: DeviceTensor,     // (B*T) int32
    types: DeviceTensor,   // (B*T) int32
    lengths: DeviceTensor, // (B) int32
}

/// What backward needs besides the module buffers.
struct Saved {
    enc: Encoded,
    labels: DeviceTensor, // (B*T) int32
    loss_mask: Vec<f32>,
    is_random: Vec<i32>,
    sop_logits: Vec<f32>, // (B, 2)
}

pub struct BertModel {
    pub(crate) config: BertConfig,
    backend: Arc<dyn Backend>,
    ctx: ParallelContext,
    vocab_padded: usize,
    /// Word + position embeddings (built without dropout: it is applied after token types);
    /// first pipeline stage only.
    pub embedding: Option<LanguageModelEmbedding>,
    /// pp > 1: the last stage's copy of the word embedding for the tied LM projection
    /// (`ParamLayout::shared_copy`, kept equal by `Model::finalize_grads`).
    pub shared_embedding: Option<Param>,
    pub tokentype_embeddings: Option<Param>,
    /// Post-LN only: `embedding.layernorm`.
    pub embedding_layernorm: Option<LayerNorm>,
    pub layers: Vec<BertLayer>,
    /// Pre-LN only: `encoder.final_layernorm`.
    pub final_layernorm: Option<LayerNorm>,
    pub lm_dense_weight: Param,
    pub lm_dense_bias: Param,
    pub lm_layernorm: LayerNorm,
    pub output_bias: Param,
    pub binary_head: Option<BinaryHead>,
    cross_entropy: VocabParallelCrossEntropy,
    /// `(V/tp)`: −inf on this rank's padded vocab ids, else 0.
    vocab_mask: Vec<f32>,
    emb: DeviceTensor,            // (B, T, C): word + position + type
    residuals: Vec<DeviceTensor>, // L+1 x (B, T, C)
    hidden: DeviceTensor,         // (B, T, C): encoder output
    lm_dense: DeviceTensor,       // (B, T, C)
    lm_act: DeviceTensor,         // (B, T, C)
    lm_norm: DeviceTensor,        // (B, T, C)
    logits: DeviceTensor,         // (B, T, V/tp); d_logits after backward
    pub(crate) d_a: DeviceTensor, // (B, T, C) backward scratch
    d_b: DeviceTensor,            // (B, T, C) backward scratch
    scratch: BackwardScratch,
    saved: Option<Saved>,
    /// The encoder-only training forward ([`BertModel::forward_encoder`]).
    pub(crate) enc_saved: Option<Encoded>,
    /// The losses of the saved training forward of the generic `Model` path (its backward
    /// turns the schedule's scale into the two mean-loss scales).
    pub(crate) pending: Option<BertLosses>,
    /// `sop loss` values for `Model::take_metrics` (one per training microbatch).
    pub(crate) metrics: Vec<(String, f64)>,
    /// Pipeline stages: the in-flight training microbatches ([`crate::stage`]).
    pub(crate) stage_stash: std::collections::BTreeMap<usize, crate::stage::InFlight>,
    /// The microbatch whose activations the module buffers hold.
    pub(crate) stage_live: Option<usize>,
}

impl BertModel {
    pub fn new(config: BertConfig, backend: Arc<dyn Backend>, ctx: ParallelContext) -> Result<BertModel> {
        BertModel::with_provider(config, backend, ctx, &LocalSpecProvider)
    }

    pub fn with_provider(
        config: BertConfig,
        backend: Arc<dyn Backend>,
        ctx: ParallelContext,
        provider: &dyn SpecProvider,
    ) -> Result<BertModel> {
        config.validate()?;
        let layer_range = crate::stage::stage_layers(config.num_layers, ctx.pp_size(), ctx.pp_rank)?;
        let (first, last) = (ctx.pp_rank == 0, ctx.is_last_stage());
        let tp = ctx.tp_size();
        let vocab_padded = config.padded_vocab_size(tp)?;
        let tcfg = config.transformer_config();
        tcfg.validate(tp)?;
        let b = ModuleBuilder::new(backend.clone(), ctx.clone(), config.seed);
        let (h, std, eps) = (config.hidden_size, config.init_method_std, config.layernorm_epsilon);
        let embedding = if first {
            Some(LanguageModelEmbedding::new(
                &b,
                "embedding",
                vocab_padded,
                config.max_position_embeddings,
                h,
                std,
                0.0,
            )?)
        } else {
            None
        };
        // Drawn from the same per-name seed as the original, so the copy starts equal.
        let shared_embedding = if last && !first {
            let name = "embedding.word_embeddings.weight";
            let mut p = b.param(name, &[vocab_padded, h], Split::Rows { chunks: 1 }, Init::Normal(std))?;
            p.layout.shared_copy = true;
            Some(p)
        } else {
            None
        };
        let tokentype_embeddings = if first && config.num_tokentypes > 0 {
            let shape = [config.num_tokentypes, h];
            Some(b.param("embedding.tokentype_embeddings.weight", &shape, Split::Replicated, Init::Normal(std))?)
        } else {
            None
        };
        let post = config.layernorm == LayerNormPlacement::Post;
        let embedding_layernorm =
            if post && first { Some(LayerNorm::new(&b, "embedding.layernorm", h, eps)?) } else { None };
        let layers = layer_range
            .map(|i| {
                BertLayer::new(
                    &b,
                    provider,
                    &format!("encoder.layers.{i}"),
                    &tcfg,
                    config.layernorm,
                    config.gelu_erf,
                    i,
                )
            })
            .collect::<Result<Vec<_>>>()
            .context("building the bert encoder")?;
        let final_layernorm =
            if post || !last { None } else { Some(LayerNorm::new(&b, "encoder.final_layernorm", h, eps)?) };
        let local = vocab_padded / tp;
        let start = ctx.tp_rank * local;
        let vocab_mask =
            (start..start + local).map(|id| if id < config.vocab_size { 0.0 } else { f32::NEG_INFINITY }).collect();
        let binary_head = if last && config.bert_binary_head { Some(BinaryHead::new(&b, h, std)?) } else { None };
        let bk = backend.as_ref();
        Ok(BertModel {
            lm_dense_weight: b.param("lm_head.dense.weight", &[h, h], Split::Replicated, Init::Normal(std))?,
            lm_dense_bias: b.param("lm_head.dense.bias", &[h], Split::Replicated, Init::Zeros)?,
            lm_layernorm: LayerNorm::new(&b, "lm_head.layer_norm", h, eps)?,
            output_bias: b.param("output_layer.bias", &[vocab_padded], Split::Rows { chunks: 1 }, Init::Zeros)?,
            cross_entropy: VocabParallelCrossEntropy::new(backend.clone(), ctx.clone())?,
            residuals: (0..=layers.len()).map(|_| empty(bk)).collect::<Result<_>>()?,
            emb: empty(bk)?,
            hidden: empty(bk)?,
            lm_dense: empty(bk)?,
            lm_act: empty(bk)?,
            lm_norm: empty(bk)?,
            logits: empty(bk)?,
            d_a: empty(bk)?,
            d_b: empty(bk)?,
            scratch: BackwardScratch::new(bk)?,
            saved: None,
            enc_saved: None,
            pending: None,
            metrics: Vec::new(),
            stage_stash: Default::default(),
            stage_live: None,
            shared_embedding,
            binary_head,
            vocab_mask,
            embedding,
            tokentype_embeddings,
            embedding_layernorm,
            layers,
            final_layernorm,
            config,
            vocab_padded,
            backend,
            ctx,
        })
    }

    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    pub fn ctx(&self) -> &ParallelContext {
        &self.ctx
    }

    pub fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    pub fn padded_vocab_size(&self) -> usize {
        self.vocab_padded
    }

    fn vocab_start(&self) -> usize {
        self.ctx.tp_rank * (self.vocab_padded / self.ctx.tp_size())
    }

    fn upload_i32(&self, v: &[i32]) -> Result<DeviceTensor> {
        self.backend.from_host(HostBuffer::I32(v.to_vec()), &[v.len()])
    }

    fn check_batch(&self, x: &BertBatch) -> Result<()> {
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
    fn encode(&mut self, x: &BertBatch, mode: Mode) -> Result<Encoded> {
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
        let h = self.config.hidden_size;
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
            ensure_shape(bk, t, &shape)?;
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
                bk.copy(input, &mut self.residuals[0])?;
            }
            _ => bail!(
                "bert pipeline stage {}: the first stage embeds tokens, every other stage takes the previous \
                 stage's hidden states",
                self.ctx.pp_rank
            ),
        }
        for (l, layer) in self.layers.iter_mut().enumerate() {
            let (done, rest) = self.residuals.split_at_mut(l + 1);
            layer.forward(&done[l], &lengths, &mut rest[0], &step)?;
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
        self.d_b = self.backend.from_host(HostBuffer::F32(d_hidden), self.hidden.shape())?;
        self.backward_from_hidden(&enc)
    }

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
        ensure_shape(bk, &mut self.logits, &[x.batch, x.seq, local])?;
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
            self.d_b = bk.from_host(HostBuffer::F32(d_hidden), self.hidden.shape())?;
        }
        self.backward_from_hidden(&saved.enc)
    }

    /// The encoder's backward from `d hidden` in `self.d_b` `(B, T, C)`.
    fn backward_from_hidden(&mut self, enc: &Encoded) -> Result<()> {
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
        for (l, layer) in self.layers.iter_mut().enumerate().rev() {
            layer.backward(&self.residuals[l], &enc.lengths, &mut self.d_a, &mut self.scratch, &step)?;
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

    /// The `(B, T, V/tp)` logits of the last forward.
    pub fn logits_tensor(&self) -> &DeviceTensor {
        &self.logits
    }

    /// The encoder output `(B, T, C)` of the last forward.
    pub fn hidden_states(&self) -> &DeviceTensor {
        &self.hidden
    }

    pub fn params(&self) -> Vec<&Param> {
        let mut p = self.embedding.as_ref().map(|e| e.params()).unwrap_or_default();
        p.extend(self.tokentype_embeddings.as_ref());
        p.extend(self.embedding_layernorm.as_ref().map(|l| l.params()).unwrap_or_default());
        p.extend(self.layers.iter().flat_map(|l| l.params()));
        p.extend(self.final_layernorm.as_ref().map(|l| l.params()).unwrap_or_default());
        if self.ctx.is_last_stage() {
            p.extend([&self.lm_dense_weight, &self.lm_dense_bias]);
            p.extend(self.lm_layernorm.params());
            p.push(&self.output_bias);
        }
        p.extend(self.binary_head.as_ref().map(|h| h.params()).unwrap_or_default());
        p.extend(self.shared_embedding.as_ref());
        p
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        let last = self.ctx.is_last_stage();
        let mut p = self.embedding.as_mut().map(|e| e.params_mut()).unwrap_or_default();
        p.extend(self.tokentype_embeddings.as_mut());
        p.extend(self.embedding_layernorm.as_mut().map(|l| l.params_mut()).unwrap_or_default());
        p.extend(self.layers.iter_mut().flat_map(|l| l.params_mut()));
        p.extend(self.final_layernorm.as_mut().map(|l| l.params_mut()).unwrap_or_default());
        if last {
            p.extend([&mut self.lm_dense_weight, &mut self.lm_dense_bias]);
            p.extend(self.lm_layernorm.params_mut());
            p.push(&mut self.output_bias);
        }
        p.extend(self.binary_head.as_mut().map(|h| h.params_mut()).unwrap_or_default());
        p.extend(self.shared_embedding.as_mut());
        p
    }

    /// Zero for every gradient.
    pub fn zero_grads(&mut self) -> Result<()> {
        let backend = self.backend.clone();
        for p in self.params_mut() {
            backend.fill(&mut p.grad, 0.0)?;
        }
        Ok(())
    }

    /// A scratch f32 tensor (for callers that need one on this model's backend).
    pub fn zeros(&self, shape: &[usize]) -> Result<DeviceTensor> {
        self.backend.zeros(shape, DType::F32)
    }
}
