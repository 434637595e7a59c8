//! [`GptModel`]: embedding → decoder block → (tied) output layer → vocab-parallel cross
//! entropy, implementing [`megatron_core::Model`] with explicit forward and backward. With
//! pipeline parallelism one object is one stage (SPEC §5.5): the first stage holds the
//! embedding, every stage its share of the layers (global numbering; even, or uneven with the
//! first/last stage counts, see [`crate::pipeline_split`]), the last the final norm, the
//! output layer and the loss. The stage forward/backward live in [`crate::stage`].
//!
//! Activations are `(B, T, C)` row-major; Megatron-Core keeps `[s, b, h]`. The per-token math
//! is identical, only the order of the flattened token rows differs (and with it nothing that
//! is observable: losses are summed, dropout masks are our own).
//!
//! Memory besides the per-layer activations (see `megatron_transformer::layer`): the logits
//! `(B, T, V/tp)` (turned into their own gradient in place by the cross-entropy backward), the
//! residual stream buffers `(stage layers + 1)·(B, T, C)`, a shared backward scratch of a few `(B, T, C)`
//! and `(B, T, F/tp)` buffers. With several microbatches in flight on a pipeline stage, one
//! such set of activations per microbatch (see `activation_stash`).

use crate::config::GptConfig;
use crate::stage::Saved;
use anyhow::{bail, Context, Result};
use megatron_core::{
    Backend, Batch, DType, DeviceTensor, GradsReadyHook, HostBuffer, LossReport, Mode, Model, ParallelContext, Param,
    StageOutput,
};
use megatron_transformer::sequence_parallel::all_reduce_sequence_parallel_grads;
use megatron_transformer::step::empty;
use megatron_transformer::{
    gpt_decoder_block_spec, gpt_layer_local_spec, Init, LanguageModelEmbedding, LocalSpecProvider, ModuleBuilder,
    SavedActivations, SpecProvider, Split, StepInfo, TransformerBlock, VocabParallelCrossEntropy,
};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

/// The name of the word embedding, also used by the last stage's tied copy.
pub const WORD_EMBEDDING: &str = "embedding.word_embeddings.weight";

pub struct GptModel {
    pub(crate) config: GptConfig,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) ctx: ParallelContext,
    pub(crate) vocab_padded: usize,
    /// Word + position embedding (first stage only).
    pub embedding: Option<LanguageModelEmbedding>,
    /// This stage's layers (and the final norm on the last stage).
    pub decoder: TransformerBlock,
    /// `output_layer.weight` when untied (last stage only); tied models use the word embedding.
    pub output_layer: Option<Param>,
    /// Tied embeddings with pp > 1: the last stage's copy of the word embedding (Megatron's
    /// `shared_embedding`), named like the original, `ParamLayout::shared_copy` set, initialised
    /// equal to it and kept equal by [`Model::finalize_grads`].
    pub shared_embedding: Option<Param>,
    pub(crate) cross_entropy: VocabParallelCrossEntropy,
    pub(crate) logits: DeviceTensor, // (B, T, V/tp); d_logits after backward
    /// `(V/tp)`: 0 for real vocab ids, -inf for this rank's padding columns (ids
    /// `>= vocab_size`), added to the logits as the output layer's bias so the padded rows
    /// drop out of the softmax; `None` when this rank holds no padding (last stage only).
    pub(crate) vocab_mask: Option<DeviceTensor>,
    pub(crate) d_hidden: DeviceTensor, // (B, T, C): gradient at the final norm output
    pub(crate) layers: Range<usize>,
    /// What each in-flight training microbatch's backward needs, by microbatch id.
    pub(crate) stash: BTreeMap<usize, Saved>,
    /// The in-flight microbatch whose activations the module buffers hold (the others' are in
    /// their stash entries).
    pub(crate) live: Option<usize>,
    /// Activation sets no microbatch uses, swapped into the modules when the live one is
    /// stashed (so a stage allocates its sets once, not every iteration).
    pub(crate) spare: Vec<SavedActivations>,
    /// Stage forwards run (see [`GptModel::forward_count`]).
    pub(crate) forwards: usize,
}

impl GptModel {
    /// Builds this rank's shards of its pipeline stage with the local spec provider.
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
        // With interleaving `ctx` names this model chunk (virtual stage) and its layers.
        let layers =
            config.virtual_stage_layers(ctx.pp_size(), ctx.virtual_pp_size, ctx.pp_rank, ctx.virtual_pp_rank)?;
        let (first, last) = (ctx.is_first_stage(), ctx.is_last_stage());
        let tp = ctx.tp_size();
        let vocab_padded = config.padded_vocab_size(tp)?;
        let tcfg = config.transformer_config();
        let b = ModuleBuilder::new(backend.clone(), ctx.clone(), config.seed)
            .with_precision(config.precision()?)
            .with_sequence_parallel(config.sequence_parallel);
        let (h, std) = (config.hidden_size, config.init_method_std);
        let embedding = if first && config.uses_rope() {
            Some(LanguageModelEmbedding::without_positions(
                &b,
                "embedding",
                vocab_padded,
                h,
                std,
                config.hidden_dropout,
            )?)
        } else if first {
            Some(LanguageModelEmbedding::new(
                &b,
                "embedding",
                vocab_padded,
                config.max_position_embeddings,
                h,
                std,
                config.hidden_dropout,
            )?)
        } else {
            None
        };
        let mut layer = gpt_layer_local_spec(config.normalization, config.swiglu, config.add_bias_linear);
        layer.self_attention.qkv_bias |= config.add_qkv_bias;
        let spec = gpt_decoder_block_spec(layer, config.num_layers);
        let mut decoder = TransformerBlock::new_stage(&b, provider, "decoder", &tcfg, &spec, layers.clone(), last)
            .context("building the gpt decoder")?;
        decoder.set_full_recompute(config.recompute)?;
        let untied = config.untie_embeddings_and_output_weights;
        let output_layer = if last && untied {
            Some(b.param("output_layer.weight", &[vocab_padded, h], Split::Rows { chunks: 1 }, Init::Normal(std))?)
        } else {
            None
        };
        // The copy draws from the same per-name seed as the original, so it starts equal
        // (Megatron zero-initialises it and all-reduces once; same result).
        let shared_embedding = if last && !first && !untied {
            let mut p = b.param(WORD_EMBEDDING, &[vocab_padded, h], Split::Rows { chunks: 1 }, Init::Normal(std))?;
            p.layout.shared_copy = true;
            Some(p)
        } else {
            None
        };
        let bk = backend.as_ref();
        let vocab_mask = if last { padding_mask(bk, config.vocab_size, vocab_padded, &ctx)? } else { None };
        Ok(GptModel {
            vocab_mask,
            cross_entropy: VocabParallelCrossEntropy::new(backend.clone(), ctx.clone())?,
            logits: empty(bk)?,
            d_hidden: empty(bk)?,
            stash: BTreeMap::new(),
            live: None,
            spare: Vec::new(),
            forwards: 0,
            layers,
            config,
            vocab_padded,
            embedding,
            decoder,
            output_layer,
            shared_embedding,
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

    /// Sequence parallelism in effect (asked for, and tp > 1).
    pub fn sequence_parallel(&self) -> bool {
        self.config.sequence_parallel && self.ctx.tp_size() > 1
    }

    pub fn padded_vocab_size(&self) -> usize {
        self.vocab_padded
    }

    /// Global numbers of this stage's decoder layers.
    pub fn layer_range(&self) -> Range<usize> {
        self.layers.clone()
    }

    pub fn param(&self, name: &str) -> Option<&Param> {
        self.params().into_iter().find(|p| p.name == name)
    }

    pub fn param_mut(&mut self, name: &str) -> Option<&mut Param> {
        self.params_mut().into_iter().find(|p| p.name == name)
    }

    /// First vocab id of this rank's logits slice.
    pub(crate) fn vocab_start(&self) -> usize {
        self.ctx.tp_rank * (self.vocab_padded / self.ctx.tp_size())
    }

    pub(crate) fn upload_ids(
        &self,
        ids: &[i32],
        what: &str,
        limit: usize,
        mask: Option<&[f32]>,
    ) -> Result<DeviceTensor> {
        for (i, &id) in ids.iter().enumerate() {
            let counted = mask.is_none_or(|m| m[i] != 0.0);
            if counted && (id < 0 || id as usize >= limit) {
                bail!("{what} id {id} at position {i} is outside the vocabulary [0, {limit}); check the tokenizer and --vocab-size");
            }
        }
        self.backend.from_host(HostBuffer::I32(ids.to_vec()), &[ids.len()])
    }

    fn require_whole_model(&self, what: &str) -> Result<()> {
        if !(self.is_first_stage() && self.is_last_stage()) {
            bail!(
                "GptModel::{what} runs the whole model, but this is pipeline stage {} of {} (layers {:?}); \
                 pipelined runs go through a pipeline schedule (`1f1b`) and the stage API",
                self.ctx.pp_rank,
                self.ctx.pp_size(),
                self.layers
            );
        }
        Ok(())
    }
}

impl Model for GptModel {
    fn name(&self) -> &str {
        "gpt"
    }

    fn forward(&mut self, batch: &Batch, mode: Mode) -> Result<LossReport> {
        self.require_whole_model("forward")?;
        // One microbatch in flight: a new forward replaces whatever was saved.
        self.discard_in_flight();
        match self.forward_stage(0, batch, None, mode)? {
            StageOutput::Loss(report) => Ok(report),
            StageOutput::Hidden(_) => bail!("the whole-model forward produced hidden states instead of a loss"),
        }
    }

    fn backward(&mut self, grad_scale: f32) -> Result<()> {
        self.require_whole_model("backward")?;
        if !self.stash.contains_key(&0) {
            bail!(
                "GptModel::backward called without a preceding forward in Mode::Train (or called twice for one forward)"
            );
        }
        self.backward_stage(0, None, grad_scale, &mut |_| Ok(()))?;
        Ok(())
    }

    fn logits(&mut self, tokens: &[i32], micro_batch_size: usize, seq_length: usize) -> Result<DeviceTensor> {
        self.require_whole_model("logits")?;
        if self.ctx.grid.cp > 1 {
            bail!("GptModel::logits runs one rank's whole sequence; build the model without context parallelism");
        }
        if tokens.len() != micro_batch_size * seq_length {
            bail!("{} tokens given for a {micro_batch_size}x{seq_length} batch", tokens.len());
        }
        let step = StepInfo { batch: micro_batch_size, seq: seq_length, train: false, seed: 0 };
        let ids = self.upload_ids(tokens, "token", self.vocab_padded, None)?;
        self.discard_in_flight();
        self.run_forward(Some(&ids), None, &step)?;
        self.run_logits(&step)?;
        let mut out = self.backend.zeros(self.logits.shape(), DType::F32)?;
        megatron_transformer::step::copy_any(self.backend.as_ref(), &self.logits, &mut out)?;
        Ok(out)
    }

    fn logits_rows(&mut self, tokens: &[i32], b: usize, s: usize, rows: &[usize]) -> Result<Option<DeviceTensor>> {
        self.logits_at_rows(tokens, b, s, rows)
    }

    fn params(&self) -> Vec<&Param> {
        let mut p = self.embedding.as_ref().map(|e| e.params()).unwrap_or_default();
        p.extend(self.decoder.params());
        p.extend(self.output_layer.as_ref());
        p.extend(self.shared_embedding.as_ref());
        p
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut p = self.embedding.as_mut().map(|e| e.params_mut()).unwrap_or_default();
        p.extend(self.decoder.params_mut());
        p.extend(self.output_layer.as_mut());
        p.extend(self.shared_embedding.as_mut());
        p
    }

    fn buffers(&self) -> Vec<&Param> {
        self.decoder.buffers()
    }

    fn buffers_mut(&mut self) -> Vec<&mut Param> {
        self.decoder.buffers_mut()
    }

    fn zero_grad(&mut self) -> Result<()> {
        let be = self.backend.clone();
        megatron_transformer::step::zero_grads(be.as_ref(), self.params_mut())
    }

    fn flops_per_iteration(&self, samples: usize) -> f64 {
        self.config.flops_per_iteration(samples, self.ctx.tp_size())
    }

    fn is_first_stage(&self) -> bool {
        self.embedding.is_some()
    }

    fn is_last_stage(&self) -> bool {
        self.ctx.is_last_stage()
    }

    fn stage_buffer(&self, batch: &Batch) -> Result<DeviceTensor> {
        // Stages exchange the residual stream (and its gradient) in its own dtype.
        let seq = batch.seq_length / self.ctx.grid.cp; // this CP rank's tokens per row
        let step = StepInfo { batch: batch.micro_batch_size, seq, train: false, seed: 0 };
        self.backend.zeros(&self.decoder.hidden_shape(&step)?, self.decoder.residual_dtype())
    }

    fn forward_stage(
        &mut self,
        microbatch: usize,
        batch: &Batch,
        input: Option<DeviceTensor>,
        mode: Mode,
    ) -> Result<StageOutput> {
        self.stage_forward(microbatch, batch, input, mode)
    }

    fn backward_stage(
        &mut self,
        microbatch: usize,
        grad_output: Option<DeviceTensor>,
        grad_scale: f32,
        on_grads_ready: GradsReadyHook,
    ) -> Result<Option<DeviceTensor>> {
        self.stage_backward(microbatch, grad_output, grad_scale, on_grads_ready)
    }

    fn finalize_grads(&mut self) -> Result<()> {
        // SPEC §5.10: the TP sum of the sequence-parallel params' partial gradients (step 2),
        // then the tied embedding (step 3), then the MLP plugins' own reductions.
        if self.sequence_parallel() {
            all_reduce_sequence_parallel_grads(&self.ctx, self.decoder.params_mut())?;
        } else if self.config.qk_layernorm {
            // --qk-layernorm: each TP rank saw only its heads (SP above already covers them).
            megatron_transformer::qk_norm::all_reduce_qk_norm_grads(&self.ctx, self.decoder.params_mut())?;
        }
        self.all_reduce_shared_embedding_grad()?;
        self.decoder.layers.iter_mut().try_for_each(|l| l.mlp.finalize_grads())
    }

    /// The MLP plugins' metrics of this stage's layers (MoE losses and expert loads).
    fn take_metrics(&mut self) -> Vec<(String, f64)> {
        self.decoder.layers.iter_mut().flat_map(|l| l.mlp.take_metrics()).collect()
    }

    /// The block calls the hook per layer; the stage adds the embedding and the output layer.
    fn set_forward_pre_hook(&mut self, hook: megatron_core::SharedForwardPreHook) -> bool {
        self.decoder.set_forward_pre_hook(Some(hook));
        true
    }
}

/// The `(V/tp)` additive logit mask of this rank's vocab slice: `-inf` on padded vocab ids so
/// they get probability 0 and gradient 0 (losses then do not depend on the padding, which
/// differs with tp), `None` when the slice has no padding.
fn padding_mask(
    bk: &dyn Backend,
    vocab: usize,
    vocab_padded: usize,
    ctx: &ParallelContext,
) -> Result<Option<DeviceTensor>> {
    let local = vocab_padded / ctx.tp_size();
    let start = ctx.tp_rank * local;
    if start + local <= vocab {
        return Ok(None);
    }
    let mask: Vec<f32> = (start..start + local).map(|id| if id < vocab { 0.0 } else { f32::NEG_INFINITY }).collect();
    Ok(Some(bk.from_host(megatron_core::HostBuffer::F32(mask), &[local])?))
}
