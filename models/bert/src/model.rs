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
use crate::heads::BinaryHead;
use crate::layer::BertLayer;
use anyhow::{Context, Result};
use megatron_core::{Backend, DType, DeviceTensor, HostBuffer, ParallelContext, Param};
use megatron_transformer::step::empty;
use megatron_transformer::{
    BackwardScratch, Init, LanguageModelEmbedding, LayerNorm, LocalSpecProvider, ModuleBuilder, NormLayer,
    SpecProvider, Split, StepInfo, VocabParallelCrossEntropy,
};
use std::sync::Arc;

// The encoder forward/backward and the pretraining losses (the LM and sentence-order heads).
mod encode;
mod losses;

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
    /// `sop loss` values for `Model::take_eval_metrics` (one per evaluation microbatch).
    pub(crate) eval_metrics: Vec<(String, f64)>,
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
        let layer_range = config.stage_layers(ctx.pp_size(), ctx.pp_rank)?;
        let (first, last) = (ctx.pp_rank == 0, ctx.is_last_stage());
        let tp = ctx.tp_size();
        let vocab_padded = config.padded_vocab_size(tp)?;
        let tcfg = config.transformer_config();
        tcfg.validate(tp)?;
        let b = ModuleBuilder::new(backend.clone(), ctx.clone(), config.seed).with_precision(config.precision()?);
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
            eval_metrics: Vec::new(),
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

    /// The activation dtype (the parameter dtype: the residual stream, hidden states and
    /// their gradients between pipeline stages).
    pub fn act_dtype(&self) -> DType {
        self.config.params_dtype
    }

    /// `t` as a fresh tensor of the activation dtype (rounded once when it is fp32 and the
    /// model is half; the host-side heads produce fp32).
    pub(crate) fn to_act(&self, t: DeviceTensor) -> Result<DeviceTensor> {
        if t.dtype() == self.act_dtype() {
            return Ok(t);
        }
        let mut out = self.backend.zeros(t.shape(), self.act_dtype())?;
        self.backend.cast(&t, &mut out)?;
        Ok(out)
    }
}
