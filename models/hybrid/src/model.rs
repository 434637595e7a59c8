//! [`HybridModel`]: word embedding (no positions, Megatron's `position_embedding_type='none'`)
//! → the layers of the pattern → `decoder.final_norm` → output layer (tied to the word
//! embedding unless untied) → vocab-parallel cross entropy, implementing
//! [`megatron_core::Model`] with explicit forward and backward.
//!
//! Parallelism: tensor parallelism inside every layer (the mixer's split is in
//! [`crate::mixer`]; attention and MLP are the transformer crate's), the vocab-parallel
//! embedding, output layer and cross entropy; pipeline stages over the pattern (its `|`
//! segments, else an even split, [`crate::config::stage_segments`]): the first stage embeds, the
//! last holds the final norm, the output layer (a copy of the word embedding when tied, its
//! gradient summed over the embedding group) and the loss. Data parallelism is the driver's.
//!
//! Activations are `(B, T, C)`; the residual stream before every layer of the stage is kept
//! for backward (`(n + 1)·(B, T, C)` for `n` layers), plus each layer's own saved tensors, one
//! set per training microbatch in flight ([`crate::stage`]).

use crate::config::{stage_segments, HybridConfig};
use crate::layers::{Branch, HybridLayer};
use crate::stage::Saved;
use anyhow::{bail, Result};
use megatron_core::{Backend, Batch, DType, DeviceTensor, HostBuffer, LossReport, Mode, Model, ParallelContext, Param};
use megatron_core::{GradsReadyHook, StageOutput};
use megatron_transformer::step::empty;
use megatron_transformer::tp_mappings::copy_to_tp_region_forward;
use megatron_transformer::{
    linear_forward, Init, LanguageModelEmbedding, LocalSpecProvider, ModuleBuilder, NormLayer, SpecProvider, Split,
    StepInfo, VocabParallelCrossEntropy,
};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

/// Megatron's name of the word embedding (and of its copy on the last stage when tied).
const WORD_EMBEDDING: &str = "embedding.word_embeddings.weight";

pub struct HybridModel {
    pub(crate) config: HybridConfig,
    pub(crate) name: &'static str,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) ctx: ParallelContext,
    pub(crate) vocab_padded: usize,
    /// First stage only.
    pub embedding: Option<LanguageModelEmbedding>,
    /// This stage's layers (their `layer_number`s are global).
    pub layers: Vec<HybridLayer>,
    pub(crate) layer_range: Range<usize>,
    /// Last stage only.
    pub final_norm: Option<Box<dyn NormLayer>>,
    /// Last stage, `--untie-embeddings-and-output-weights`.
    pub output_layer: Option<Param>,
    /// Last stage of pp > 1 with tied weights: the copy of the word embedding (same name,
    /// `shared_copy`), its gradient summed with the first stage's in `finalize_grads`.
    pub(crate) shared_embedding: Option<Param>,
    pub(crate) ce: VocabParallelCrossEntropy,
    /// `(V_padded/tp)`: 0 for real ids, −inf for the padding of this rank's vocab slice.
    pub(crate) vocab_mask: Option<DeviceTensor>,
    pub(crate) logits: DeviceTensor, // (B, T, V/tp); d_logits after backward
    /// What each in-flight training microbatch's backward needs, by microbatch id.
    pub(crate) stash: BTreeMap<usize, Saved>,
}

/// The additive logit mask of this rank's vocab slice (`None` when it has no padding).
fn padding_mask(
    be: &dyn Backend,
    vocab: usize,
    vocab_padded: usize,
    ctx: &ParallelContext,
) -> Result<Option<DeviceTensor>> {
    let local = vocab_padded / ctx.tp_size();
    let start = ctx.tp_rank * local;
    if start + local <= vocab {
        return Ok(None);
    }
    let m: Vec<f32> = (start..start + local).map(|id| if id < vocab { 0.0 } else { f32::NEG_INFINITY }).collect();
    Ok(Some(be.from_host(HostBuffer::F32(m), &[local])?))
}

impl HybridModel {
    /// `name` is the registered name (`hybrid` or `mamba`). A pattern with `E` (MoE) layers
    /// needs [`Self::with_mlp`].
    pub fn new(
        config: HybridConfig,
        name: &'static str,
        backend: Arc<dyn Backend>,
        ctx: ParallelContext,
    ) -> Result<Self> {
        Self::with_mlp(config, name, backend, ctx, None)
    }

    /// [`Self::new`] with the `mlp` plugin (MoE) that fills the `E` layers (as the GPT model
    /// gets it: `ModelEnv::mlp`).
    pub fn with_mlp(
        config: HybridConfig,
        name: &'static str,
        backend: Arc<dyn Backend>,
        ctx: ParallelContext,
        mlp: Option<&megatron_core::MlpProvider>,
    ) -> Result<Self> {
        if ctx.grid.cp > 1 {
            bail!("the {name} model does not run with context parallelism yet; use --context-parallel-size 1");
        }
        let tp = ctx.tp_size();
        config.validate(tp)?;
        let kinds = config.layers()?;
        let layer_range = stage_segments(&config.hybrid_layer_pattern, ctx.pp_size())?[ctx.pp_rank].clone();
        let (first, last) = (ctx.is_first_stage(), ctx.is_last_stage());
        let b = ModuleBuilder::new(backend.clone(), ctx.clone(), config.seed).with_precision(config.precision()?);
        let (h, std) = (config.hidden_size, config.init_method_std);
        let vocab_padded = config.padded_vocab_size(tp);
        let tcfg = config.transformer_config();
        let embedding = if first {
            Some(LanguageModelEmbedding::without_positions(
                &b,
                "embedding",
                vocab_padded,
                h,
                std,
                config.hidden_dropout,
            )?)
        } else {
            None
        };
        let layers = layer_range
            .clone()
            .map(|i| HybridLayer::new(&b, &config, &tcfg, kinds[i], i, mlp))
            .collect::<Result<Vec<_>>>()?;
        let final_norm = if last {
            Some(LocalSpecProvider.norm(&b, "decoder.final_norm", config.normalization, h, config.layernorm_epsilon)?)
        } else {
            None
        };
        let untied = config.untie_embeddings_and_output_weights;
        let output_layer = if last && untied {
            Some(b.param("output_layer.weight", &[vocab_padded, h], Split::Rows { chunks: 1 }, Init::Normal(std))?)
        } else {
            None
        };
        // Drawn from the original's per-name seed, so the copy starts equal to it.
        let shared_embedding = if last && !first && !untied {
            let mut p = b.param(WORD_EMBEDDING, &[vocab_padded, h], Split::Rows { chunks: 1 }, Init::Normal(std))?;
            p.layout.shared_copy = true;
            Some(p)
        } else {
            None
        };
        let vocab_mask =
            if last { padding_mask(backend.as_ref(), config.vocab_size, vocab_padded, &ctx)? } else { None };
        Ok(HybridModel {
            ce: VocabParallelCrossEntropy::new(backend.clone(), ctx.clone())?,
            logits: empty(backend.as_ref())?,
            config,
            name,
            vocab_padded,
            embedding,
            layers,
            layer_range,
            final_norm,
            output_layer,
            shared_embedding,
            vocab_mask,
            stash: BTreeMap::new(),
            backend,
            ctx,
        })
    }

    pub fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    pub fn ctx(&self) -> &ParallelContext {
        &self.ctx
    }

    /// Global numbers of this stage's layers.
    pub fn layer_range(&self) -> Range<usize> {
        self.layer_range.clone()
    }

    /// The whole model on this rank (tp = pp = 1): what import/export and decoding need.
    pub(crate) fn ensure_whole(&self, what: &str) -> Result<()> {
        if self.ctx.tp_size() > 1 || self.ctx.pp_size() > 1 {
            bail!(
                "{what} of the {} model runs on one rank (tp = pp = 1); this rank holds tp {} x pp {} shards",
                self.name,
                self.ctx.tp_size(),
                self.ctx.pp_size()
            );
        }
        Ok(())
    }

    /// First vocab id of this rank's logits slice.
    pub(crate) fn vocab_start(&self) -> usize {
        self.ctx.tp_rank * (self.vocab_padded / self.ctx.tp_size())
    }

    /// The output layer's weight (last stage): untied, the shared copy, or the embedding.
    pub(crate) fn output_weight(&self) -> Result<&Param> {
        match (&self.output_layer, &self.shared_embedding, &self.embedding) {
            (Some(p), _, _) | (None, Some(p), _) => Ok(p),
            (None, None, Some(e)) => Ok(&e.word_embeddings.weight),
            (None, None, None) => bail!("pipeline stage {} has no output layer", self.ctx.pp_rank),
        }
    }

    /// Logits `(rows, V_padded/tp)` of the output layer on `head_in (rows, C)`.
    pub(crate) fn head_logits(&self, head_in: &DeviceTensor, rows: usize) -> Result<DeviceTensor> {
        let local = self.vocab_padded / self.ctx.tp_size();
        let mut logits = self.backend.zeros(&[rows, local], DType::F32)?;
        copy_to_tp_region_forward(&self.ctx, head_in)?;
        linear_forward(
            self.backend.as_ref(),
            head_in,
            &self.output_weight()?.value,
            self.vocab_mask.as_ref(),
            &mut logits,
        )?;
        Ok(logits)
    }

    pub fn config(&self) -> &HybridConfig {
        &self.config
    }

    /// dtype of the residual stream: the layer inputs/outputs, their gradients and what pipeline
    /// stages exchange (fp32 unless the model is half without `--fp32-residual-connection`).
    pub fn residual_dtype(&self) -> DType {
        if self.config.fp32_residual_connection {
            DType::F32
        } else {
            self.config.params_dtype
        }
    }

    pub fn padded_vocab_size(&self) -> usize {
        self.vocab_padded
    }

    pub(crate) fn ids(&self, v: &[i32], what: &str, limit: usize, mask: Option<&[f32]>) -> Result<DeviceTensor> {
        for (i, &id) in v.iter().enumerate() {
            if mask.is_none_or(|m| m[i] != 0.0) && (id < 0 || id as usize >= limit) {
                bail!("{what} id {id} at position {i} is outside the vocabulary [0, {limit}); check the tokenizer and --vocab-size");
            }
        }
        self.backend.from_host(HostBuffer::I32(v.to_vec()), &[v.len()])
    }
}

impl Model for HybridModel {
    fn name(&self) -> &str {
        self.name
    }

    fn forward(&mut self, batch: &Batch, mode: Mode) -> Result<LossReport> {
        match self.stage_forward(0, batch, None, mode)? {
            StageOutput::Loss(r) => Ok(r),
            StageOutput::Hidden(_) => {
                bail!(
                    "{}: forward of the whole model on pipeline stage {}; use the pipeline schedule",
                    self.name,
                    self.ctx.pp_rank
                )
            }
        }
    }

    fn backward(&mut self, grad_scale: f32) -> Result<()> {
        self.stage_backward(0, None, grad_scale, &mut |_| Ok(())).map(|_| ())
    }

    fn logits(&mut self, tokens: &[i32], micro_batch_size: usize, seq_length: usize) -> Result<DeviceTensor> {
        if self.ctx.pp_size() > 1 {
            bail!("{}: logits of the whole model need pp = 1", self.name);
        }
        if tokens.len() != micro_batch_size * seq_length {
            bail!("{} tokens given for a {micro_batch_size}x{seq_length} batch", tokens.len());
        }
        let step = StepInfo { batch: micro_batch_size, seq: seq_length, train: false, seed: 0 };
        let ids = self.ids(tokens, "token", self.vocab_padded, None)?;
        self.run_stage(Some(&ids), None, &step)?;
        let mut out = self.backend.zeros(self.logits.shape(), DType::F32)?;
        self.backend.copy(&self.logits, &mut out)?;
        Ok(out)
    }

    fn params(&self) -> Vec<&Param> {
        let mut v = self.embedding.as_ref().map(|e| e.params()).unwrap_or_default();
        for l in &self.layers {
            v.extend(l.params());
        }
        v.extend(self.final_norm.as_ref().map(|n| n.params()).unwrap_or_default());
        v.extend(self.output_layer.as_ref());
        v.extend(self.shared_embedding.as_ref());
        v
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut v = self.embedding.as_mut().map(|e| e.params_mut()).unwrap_or_default();
        for l in &mut self.layers {
            v.extend(l.params_mut());
        }
        v.extend(self.final_norm.as_mut().map(|n| n.params_mut()).unwrap_or_default());
        v.extend(self.output_layer.as_mut());
        v.extend(self.shared_embedding.as_mut());
        v
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
        self.final_norm.is_some()
    }

    fn stage_buffer(&self, batch: &Batch) -> Result<DeviceTensor> {
        let shape = [batch.micro_batch_size, batch.seq_length, self.config.hidden_size];
        self.backend.zeros(&shape, self.residual_dtype())
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
        self.all_reduce_shared_embedding_grad()?;
        self.layers.iter_mut().try_for_each(|l| match &mut l.branch {
            Branch::Moe(m) => m.finalize_grads(),
            _ => Ok(()),
        })
    }

    /// The `E` layers' checkpointed buffers (an MoE router's expert bias).
    fn buffers(&self) -> Vec<&Param> {
        self.layers
            .iter()
            .flat_map(|l| match &l.branch {
                Branch::Moe(m) => m.buffers(),
                _ => Vec::new(),
            })
            .collect()
    }

    fn buffers_mut(&mut self) -> Vec<&mut Param> {
        self.layers
            .iter_mut()
            .flat_map(|l| match &mut l.branch {
                Branch::Moe(m) => m.buffers_mut(),
                _ => Vec::new(),
            })
            .collect()
    }

    fn take_metrics(&mut self) -> Vec<(String, f64)> {
        self.layers
            .iter_mut()
            .flat_map(|l| match &mut l.branch {
                Branch::Moe(m) => m.take_metrics(),
                _ => Vec::new(),
            })
            .collect()
    }
}
