//! [`HybridModel`]: word embedding (no positions, Megatron's `position_embedding_type='none'`)
//! → the layers of the pattern → `decoder.final_norm` → output layer (tied to the word
//! embedding unless untied) → vocab-parallel cross entropy, implementing
//! [`megatron_core::Model`] with explicit forward and backward. One pipeline stage, tp = 1
//! (the mixer refuses tp > 1); data parallelism works through the driver as for every model.
//!
//! Activations are `(B, T, C)`; the residual stream before every layer is kept for backward
//! (`(L + 1)·(B, T, C)`), plus each layer's own saved tensors.

use crate::config::HybridConfig;
use crate::layers::HybridLayer;
use anyhow::{bail, Result};
use megatron_core::{Backend, Batch, DType, DeviceTensor, HostBuffer, LossReport, Mode, Model, ParallelContext, Param};
use megatron_transformer::step::empty;
use megatron_transformer::{
    linear_backward, linear_forward, BackwardScratch, Init, LanguageModelEmbedding, LocalSpecProvider, ModuleBuilder,
    NormLayer, SpecProvider, Split, StepInfo, VocabParallelCrossEntropy,
};
use std::sync::Arc;

/// What a training forward keeps besides the modules' own caches.
struct Saved {
    step: StepInfo,
    ids: DeviceTensor,         // (B*T) int32
    labels: DeviceTensor,      // (B*T) int32
    loss_mask: Vec<f32>,       // (B*T)
    stream: Vec<DeviceTensor>, // L + 1 tensors (B, T, C): the input of every layer, then the last output
    head_in: DeviceTensor,     // (B, T, C): final norm output
}

pub struct HybridModel {
    config: HybridConfig,
    name: &'static str,
    backend: Arc<dyn Backend>,
    ctx: ParallelContext,
    vocab_padded: usize,
    pub embedding: LanguageModelEmbedding,
    pub layers: Vec<HybridLayer>,
    pub final_norm: Box<dyn NormLayer>,
    pub output_layer: Option<Param>,
    ce: VocabParallelCrossEntropy,
    /// `(V_padded)`: 0 for real ids, −inf for the padding (as the GPT model).
    vocab_mask: Option<DeviceTensor>,
    logits: DeviceTensor, // (B, T, V); d_logits after backward
    saved: Option<Saved>,
}

impl HybridModel {
    /// `name` is the registered name (`hybrid` or `mamba`).
    pub fn new(
        config: HybridConfig,
        name: &'static str,
        backend: Arc<dyn Backend>,
        ctx: ParallelContext,
    ) -> Result<Self> {
        if ctx.pp_size() > 1 || ctx.grid.cp > 1 {
            bail!(
                "the {name} model runs one pipeline stage without context parallelism for now; use \
                 --pipeline-model-parallel-size 1 --context-parallel-size 1 (data parallelism works)"
            );
        }
        let tp = ctx.tp_size();
        config.validate(tp)?;
        let kinds = config.layers()?;
        let b = ModuleBuilder::new(backend.clone(), ctx.clone(), config.seed);
        let (h, std) = (config.hidden_size, config.init_method_std);
        let vocab_padded = config.padded_vocab_size(tp);
        let tcfg = config.transformer_config();
        let embedding =
            LanguageModelEmbedding::without_positions(&b, "embedding", vocab_padded, h, std, config.hidden_dropout)?;
        let layers = kinds
            .iter()
            .enumerate()
            .map(|(i, &k)| HybridLayer::new(&b, &config, &tcfg, k, i))
            .collect::<Result<Vec<_>>>()?;
        let final_norm =
            LocalSpecProvider.norm(&b, "decoder.final_norm", config.normalization, h, config.layernorm_epsilon)?;
        let output_layer = if config.untie_embeddings_and_output_weights {
            Some(b.param("output_layer.weight", &[vocab_padded, h], Split::Rows { chunks: 1 }, Init::Normal(std))?)
        } else {
            None
        };
        let vocab_mask = if vocab_padded > config.vocab_size {
            let m: Vec<f32> =
                (0..vocab_padded).map(|id| if id < config.vocab_size { 0.0 } else { f32::NEG_INFINITY }).collect();
            Some(backend.from_host(HostBuffer::F32(m), &[vocab_padded])?)
        } else {
            None
        };
        Ok(HybridModel {
            ce: VocabParallelCrossEntropy::new(backend.clone(), ctx.clone())?,
            logits: empty(backend.as_ref())?,
            config,
            name,
            vocab_padded,
            embedding,
            layers,
            final_norm,
            output_layer,
            vocab_mask,
            saved: None,
            backend,
            ctx,
        })
    }

    pub fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    /// Logits `(rows, V_padded)` of the output layer on `head_in (rows, C)`.
    pub(crate) fn head_logits(&self, head_in: &DeviceTensor, rows: usize) -> Result<DeviceTensor> {
        let mut logits = self.backend.zeros(&[rows, self.vocab_padded], DType::F32)?;
        let w = match &self.output_layer {
            Some(p) => &p.value,
            None => &self.embedding.word_embeddings.weight.value,
        };
        linear_forward(self.backend.as_ref(), head_in, w, self.vocab_mask.as_ref(), &mut logits)?;
        Ok(logits)
    }

    pub fn config(&self) -> &HybridConfig {
        &self.config
    }

    pub fn padded_vocab_size(&self) -> usize {
        self.vocab_padded
    }

    fn ids(&self, v: &[i32], what: &str, limit: usize, mask: Option<&[f32]>) -> Result<DeviceTensor> {
        for (i, &id) in v.iter().enumerate() {
            if mask.is_none_or(|m| m[i] != 0.0) && (id < 0 || id as usize >= limit) {
                bail!("{what} id {id} at position {i} is outside the vocabulary [0, {limit}); check the tokenizer and --vocab-size");
            }
        }
        self.backend.from_host(HostBuffer::I32(v.to_vec()), &[v.len()])
    }

    /// Embedding, layers, final norm and logits; returns the stream and the head input.
    fn run(&mut self, ids: &DeviceTensor, step: &StepInfo) -> Result<(Vec<DeviceTensor>, DeviceTensor)> {
        let be = self.backend.clone();
        let be = be.as_ref();
        let shape = [step.batch, step.seq, self.config.hidden_size];
        let mut x = be.zeros(&shape, DType::F32)?;
        self.embedding.forward(ids, &mut x, step)?;
        let mut stream = vec![x];
        for layer in &mut self.layers {
            let mut y = be.zeros(&shape, DType::F32)?;
            layer.forward(stream.last().unwrap_or_else(|| unreachable!()), &mut y, step)?;
            stream.push(y);
        }
        let mut head_in = be.zeros(&shape, DType::F32)?;
        self.final_norm.forward(stream.last().unwrap_or_else(|| unreachable!()), &mut head_in)?;
        self.logits = self.head_logits(&head_in, step.tokens())?;
        self.logits.reshape(&[step.batch, step.seq, self.vocab_padded])?;
        Ok((stream, head_in))
    }
}

impl Model for HybridModel {
    fn name(&self) -> &str {
        self.name
    }

    fn forward(&mut self, batch: &Batch, mode: Mode) -> Result<LossReport> {
        let (b, s) = (batch.micro_batch_size, batch.seq_length);
        let n = b * s;
        if batch.tokens.len() != n || batch.labels.len() != n || batch.loss_mask.len() != n {
            bail!("batch of {b}x{s} must have {n} tokens, labels and loss-mask entries");
        }
        let train = mode == Mode::Train;
        let step = StepInfo { batch: b, seq: s, train, seed: batch.seed };
        let ids = self.ids(&batch.tokens, "token", self.vocab_padded, None)?;
        let labels = self.ids(&batch.labels, "label", self.config.vocab_size, Some(&batch.loss_mask))?;
        let (stream, head_in) = self.run(&ids, &step)?;
        let losses = self.ce.forward(&self.logits, &labels, 0)?;
        let mut report = LossReport::default();
        for (l, &m) in losses.iter().zip(&batch.loss_mask) {
            if m != 0.0 {
                report.loss_sum += l * m as f64;
                report.num_tokens += m as f64;
            }
        }
        self.saved = train.then(|| Saved { step, ids, labels, loss_mask: batch.loss_mask.clone(), stream, head_in });
        Ok(report)
    }

    fn backward(&mut self, grad_scale: f32) -> Result<()> {
        let Some(s) = self.saved.take() else { bail!("{} backward called without a training forward", self.name) };
        let be = self.backend.clone();
        let be = be.as_ref();
        let d_loss: Vec<f32> = s.loss_mask.iter().map(|m| m * grad_scale).collect();
        let d_loss = be.from_host(HostBuffer::F32(d_loss), &[s.step.tokens()])?;
        self.ce.backward_inplace(&mut self.logits, &s.labels, 0, &d_loss)?;
        let mut d_head = be.zeros(s.head_in.shape(), DType::F32)?;
        let w = match self.output_layer.as_mut() {
            Some(p) => p,
            None => &mut self.embedding.word_embeddings.weight,
        };
        linear_backward(be, &s.head_in, &w.value, &self.logits, Some(&mut d_head), &mut w.grad, None)?;
        let mut d_res = be.zeros(s.head_in.shape(), DType::F32)?;
        self.final_norm.backward(&d_head, &s.stream[self.layers.len()], &mut d_res)?;
        let mut scratch = BackwardScratch::new(be)?;
        for (i, layer) in self.layers.iter_mut().enumerate().rev() {
            layer.backward(
                &s.stream[i],
                &mut d_res,
                &mut scratch.d_branch,
                &mut scratch.d_norm,
                &mut scratch.inner,
                &s.step,
            )?;
        }
        self.embedding.backward(&s.ids, &d_res, &s.step)
    }

    fn logits(&mut self, tokens: &[i32], micro_batch_size: usize, seq_length: usize) -> Result<DeviceTensor> {
        if tokens.len() != micro_batch_size * seq_length {
            bail!("{} tokens given for a {micro_batch_size}x{seq_length} batch", tokens.len());
        }
        let step = StepInfo { batch: micro_batch_size, seq: seq_length, train: false, seed: 0 };
        let ids = self.ids(tokens, "token", self.vocab_padded, None)?;
        self.saved = None;
        self.run(&ids, &step)?;
        let mut out = self.backend.zeros(self.logits.shape(), DType::F32)?;
        self.backend.copy(&self.logits, &mut out)?;
        Ok(out)
    }

    fn params(&self) -> Vec<&Param> {
        let mut v = self.embedding.params();
        for l in &self.layers {
            v.extend(l.params());
        }
        v.extend(self.final_norm.params());
        v.extend(self.output_layer.as_ref());
        v
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut v = self.embedding.params_mut();
        for l in &mut self.layers {
            v.extend(l.params_mut());
        }
        v.extend(self.final_norm.params_mut());
        v.extend(self.output_layer.as_mut());
        v
    }

    fn zero_grad(&mut self) -> Result<()> {
        let be = self.backend.clone();
        for p in self.params_mut() {
            be.fill(&mut p.grad, 0.0)?;
        }
        Ok(())
    }

    fn flops_per_iteration(&self, samples: usize) -> f64 {
        self.config.flops_per_iteration(samples, self.ctx.tp_size())
    }
}
