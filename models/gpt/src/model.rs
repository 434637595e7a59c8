//! [`GptModel`]: embedding → decoder block → (tied) output layer → vocab-parallel cross
//! entropy, implementing [`megatron_core::Model`] with explicit forward and backward.
//!
//! Activations are `(B, T, C)` row-major; Megatron-Core keeps `[s, b, h]`. The per-token math
//! is identical, only the order of the flattened token rows differs (and with it nothing that
//! is observable: losses are summed, dropout masks are our own).
//!
//! Memory besides the per-layer activations (see `megatron_transformer::layer`): the logits
//! `(B, T, V/tp)` (turned into their own gradient in place by the cross-entropy backward), the
//! residual stream buffers `(L+1)·(B, T, C)` and a shared backward scratch of a few `(B, T, C)`
//! and `(B, T, F/tp)` buffers. All are allocated once per `(B, T)` and reused.

use crate::config::GptConfig;
use anyhow::{bail, Context, Result};
use megatron_core::{Backend, Batch, DType, DeviceTensor, HostBuffer, LossReport, Mode, Model, ParallelContext, Param};
use megatron_transformer::step::{empty, ensure_shape};
use megatron_transformer::tp_mappings::{copy_to_tp_region_backward, copy_to_tp_region_forward};
use megatron_transformer::{
    gpt_decoder_block_spec, gpt_layer_local_spec, linear_backward, linear_forward, Init, LanguageModelEmbedding,
    LocalSpecProvider, ModuleBuilder, SpecProvider, Split, StepInfo, TransformerBlock, VocabParallelCrossEntropy,
};
use std::sync::Arc;

/// What backward needs from the forward of the microbatch in flight.
struct Saved {
    step: StepInfo,
    loss_mask: Vec<f32>,
    tokens: DeviceTensor, // (B*T) int32
    labels: DeviceTensor, // (B*T) int32
}

pub struct GptModel {
    config: GptConfig,
    backend: Arc<dyn Backend>,
    ctx: ParallelContext,
    vocab_padded: usize,
    pub embedding: LanguageModelEmbedding,
    pub decoder: TransformerBlock,
    /// `output_layer.weight` when untied; tied models use the word embedding.
    pub output_layer: Option<Param>,
    cross_entropy: VocabParallelCrossEntropy,
    logits: DeviceTensor,   // (B, T, V/tp); d_logits after backward
    d_hidden: DeviceTensor, // (B, T, C): gradient at the final norm output
    saved: Option<Saved>,
}

impl GptModel {
    /// Builds this rank's shards with the local spec provider.
    pub fn new(config: GptConfig, backend: Arc<dyn Backend>, ctx: ParallelContext) -> Result<GptModel> {
        GptModel::with_provider(config, backend, ctx, &LocalSpecProvider)
    }

    /// Builds with any [`SpecProvider`] (a different linear/norm implementation).
    pub fn with_provider(
        config: GptConfig,
        backend: Arc<dyn Backend>,
        ctx: ParallelContext,
        provider: &dyn SpecProvider,
    ) -> Result<GptModel> {
        config.validate()?;
        if ctx.pp_size() > 1 {
            bail!(
                "the gpt model runs as a single pipeline stage (the Model trait has no stage-to-stage \
                 activation hand-off yet); use --pipeline-model-parallel-size 1"
            );
        }
        let tp = ctx.tp_size();
        let vocab_padded = config.padded_vocab_size(tp)?;
        let tcfg = config.transformer_config();
        let b = ModuleBuilder::new(backend.clone(), ctx.clone(), config.seed);
        let (h, std) = (config.hidden_size, config.init_method_std);
        let embedding = LanguageModelEmbedding::new(
            &b,
            "embedding",
            vocab_padded,
            config.max_position_embeddings,
            h,
            std,
            config.hidden_dropout,
        )?;
        let layer = gpt_layer_local_spec(config.normalization, config.swiglu, config.add_bias_linear);
        let decoder =
            TransformerBlock::new(&b, provider, "decoder", &tcfg, &gpt_decoder_block_spec(layer, config.num_layers))
                .context("building the gpt decoder")?;
        let output_layer = if config.untie_embeddings_and_output_weights {
            Some(b.param("output_layer.weight", &[vocab_padded, h], Split::Rows { chunks: 1 }, Init::Normal(std))?)
        } else {
            None
        };
        let bk = backend.as_ref();
        Ok(GptModel {
            cross_entropy: VocabParallelCrossEntropy::new(backend.clone(), ctx.clone())?,
            logits: empty(bk)?,
            d_hidden: empty(bk)?,
            saved: None,
            config,
            vocab_padded,
            embedding,
            decoder,
            output_layer,
            backend,
            ctx,
        })
    }

    pub fn config(&self) -> &GptConfig {
        &self.config
    }

    /// The backend the parameters live on.
    pub fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    pub fn padded_vocab_size(&self) -> usize {
        self.vocab_padded
    }

    pub fn param(&self, name: &str) -> Option<&Param> {
        self.params().into_iter().find(|p| p.name == name)
    }

    pub fn param_mut(&mut self, name: &str) -> Option<&mut Param> {
        self.params_mut().into_iter().find(|p| p.name == name)
    }

    /// First vocab id of this rank's logits slice.
    fn vocab_start(&self) -> usize {
        self.embedding.word_embeddings.vocab_range().0
    }

    fn upload_ids(&self, ids: &[i32], what: &str, limit: usize, mask: Option<&[f32]>) -> Result<DeviceTensor> {
        for (i, &id) in ids.iter().enumerate() {
            let counted = mask.is_none_or(|m| m[i] != 0.0);
            if counted && (id < 0 || id as usize >= limit) {
                bail!("{what} id {id} at position {i} is outside the vocabulary [0, {limit}); check the tokenizer and --vocab-size");
            }
        }
        self.backend.from_host(HostBuffer::I32(ids.to_vec()), &[ids.len()])
    }

    /// Embedding, decoder and output layer: fills `self.logits (B, T, V/tp)`.
    fn run_to_logits(&mut self, tokens: &DeviceTensor, step: &StepInfo) -> Result<()> {
        if step.seq > self.config.max_position_embeddings {
            bail!("sequence length {} > max_position_embeddings {}", step.seq, self.config.max_position_embeddings);
        }
        self.embedding.forward(tokens, self.decoder.input_mut(step)?, step)?;
        self.decoder.forward(step)?;
        let vocab_local = self.vocab_padded / self.ctx.tp_size();
        ensure_shape(self.backend.as_ref(), &mut self.logits, &[step.batch, step.seq, vocab_local])?;
        let w = match &self.output_layer {
            Some(p) => &p.value,
            None => &self.embedding.word_embeddings.weight.value,
        };
        // Output layer: column-parallel, no bias, logits stay vocab-parallel.
        let x = self.decoder.output();
        copy_to_tp_region_forward(&self.ctx, x)?;
        linear_forward(self.backend.as_ref(), x, w, None, &mut self.logits)
    }
}

impl Model for GptModel {
    fn name(&self) -> &str {
        "gpt"
    }

    fn forward(&mut self, batch: &Batch, mode: Mode) -> Result<LossReport> {
        let (b, s) = (batch.micro_batch_size, batch.seq_length);
        let n = b * s;
        if batch.tokens.len() != n || batch.labels.len() != n || batch.loss_mask.len() != n {
            bail!(
                "batch of {b}x{s} has {} tokens, {} labels and {} loss-mask entries; all must be {n}",
                batch.tokens.len(),
                batch.labels.len(),
                batch.loss_mask.len()
            );
        }
        let step = StepInfo { batch: b, seq: s, train: mode == Mode::Train, seed: batch.seed };
        let tokens = self.upload_ids(&batch.tokens, "token", self.vocab_padded, None)?;
        let labels = self.upload_ids(&batch.labels, "label", self.vocab_padded, Some(&batch.loss_mask))?;
        self.saved = None;
        self.run_to_logits(&tokens, &step)?;
        let losses = self.cross_entropy.forward(&self.logits, &labels, self.vocab_start())?;
        let mut report = LossReport::default();
        for (loss, &m) in losses.iter().zip(&batch.loss_mask) {
            if m != 0.0 {
                report.loss_sum += loss * m as f64;
                report.num_tokens += m as f64;
            }
        }
        if step.train {
            self.saved = Some(Saved { step, loss_mask: batch.loss_mask.clone(), tokens, labels });
        }
        Ok(report)
    }

    fn backward(&mut self, grad_scale: f32) -> Result<()> {
        let saved = self.saved.take().context(
            "GptModel::backward called without a preceding forward in Mode::Train (or called twice for one forward)",
        )?;
        let step = saved.step;
        let d_loss: Vec<f32> = saved.loss_mask.iter().map(|m| grad_scale * m).collect();
        let d_loss = self.backend.from_host(HostBuffer::F32(d_loss), &[step.tokens()])?;
        let vocab_start = self.vocab_start();
        self.cross_entropy.backward_inplace(&mut self.logits, &saved.labels, vocab_start, &d_loss)?;

        // Output layer backward (the logits buffer now holds d_logits).
        let bk = self.backend.as_ref();
        ensure_shape(bk, &mut self.d_hidden, self.decoder.output().shape())?;
        let w = match self.output_layer.as_mut() {
            Some(p) => p,
            None => &mut self.embedding.word_embeddings.weight,
        };
        let x = self.decoder.output();
        linear_backward(bk, x, &w.value, &self.logits, Some(&mut self.d_hidden), &mut w.grad, None)?;
        copy_to_tp_region_backward(&self.ctx, &mut self.d_hidden)?;

        let d_embedding = self.decoder.backward(&self.d_hidden, &step)?;
        self.embedding.backward(&saved.tokens, d_embedding, &step)
    }

    fn logits(&mut self, tokens: &[i32], micro_batch_size: usize, seq_length: usize) -> Result<DeviceTensor> {
        if tokens.len() != micro_batch_size * seq_length {
            bail!("{} tokens given for a {micro_batch_size}x{seq_length} batch", tokens.len());
        }
        let step = StepInfo { batch: micro_batch_size, seq: seq_length, train: false, seed: 0 };
        let ids = self.upload_ids(tokens, "token", self.vocab_padded, None)?;
        self.saved = None;
        self.run_to_logits(&ids, &step)?;
        let mut out = self.backend.zeros(self.logits.shape(), DType::F32)?;
        self.backend.copy(&self.logits, &mut out)?;
        Ok(out)
    }

    fn params(&self) -> Vec<&Param> {
        let mut p = self.embedding.params();
        p.extend(self.decoder.params());
        p.extend(self.output_layer.as_ref());
        p
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut p = self.embedding.params_mut();
        p.extend(self.decoder.params_mut());
        p.extend(self.output_layer.as_mut());
        p
    }

    fn zero_grad(&mut self) -> Result<()> {
        let backend = self.backend.clone();
        for p in self.params_mut() {
            backend.fill(&mut p.grad, 0.0)?;
        }
        Ok(())
    }

    fn flops_per_iteration(&self, samples: usize) -> f64 {
        self.config.flops_per_iteration(samples, self.ctx.tp_size())
    }
}
