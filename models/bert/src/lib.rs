//! `megatron-bert`: the BERT encoder (Megatron-Core `BertModel`, SPEC §4.8) built from the
//! `megatron-transformer` building blocks plus what BERT adds: bidirectional attention with a
//! key-padding mask (`Backend::attention_padded_*`), token-type embeddings, pre-LN or post-LN
//! layers, the LM head (dense → GeLU → LayerNorm → tied projection + vocab bias) and the
//! binary (sentence-order) head on the pooled `[CLS]`; registered as the `bert` model plugin.
//!
//! [`BertModel::forward_bert`] / [`BertModel::backward_bert`] take a [`BertBatch`] (types,
//! padding lengths, `is_random`). Through the generic [`megatron_core::Model`] trait (whose
//! `Batch` has only tokens, labels and loss mask):
//! * with `seq_length` set (`megatron pretrain --model bert`) a batch holds the packed samples
//!   of the `bert` dataset ([`batch`]); the forward reports Megatron's microbatch `lm loss`
//!   (`Σ ce·mask / Σ mask`) as one unit (`num_tokens = 1`, so the schedule's scale is the
//!   microbatch average, as Megatron's BERT loss), the backward adds the `sop loss` (the sum
//!   `lm + sop` is the objective, as in `pretrain_bert.py`), and `take_metrics` returns the sop
//!   loss averaged over data-parallel ranks (the log line's `sop loss`), `take_eval_metrics`
//!   that of the evaluation forwards (the validation block's `sop loss value`);
//! * without it a batch is read as unpadded rows of token type 0 and only the LM loss (per
//!   token) is reported.

pub mod attention;
pub mod batch;
pub mod classifier;
pub mod config;
pub mod heads;
pub mod hf;
pub mod layer;
pub mod mlp;
pub mod model;
pub mod stage;

pub use classifier::{BertClassifier, ClassifierOutput};
pub use config::{BertConfig, LayerNormPlacement};
pub use model::{BertBatch, BertLosses, BertModel};

use anyhow::{bail, Context};
use megatron_core::registry::{parse_config, ConfigDe, ModelEnv};
use megatron_core::{
    Batch, DType, DeviceTensor, Factory, GradsReadyHook, LossReport, Mode, Model, Param, Plugin, Result, StageOutput,
};

impl BertModel {
    /// A generic [`Batch`] as a [`BertBatch`]: every row unpadded, token type 0, no SOP label.
    pub fn bert_batch(&self, b: &Batch) -> BertBatch {
        let n = b.micro_batch_size * b.seq_length;
        BertBatch {
            batch: b.micro_batch_size,
            seq: b.seq_length,
            tokens: b.tokens.clone(),
            types: vec![0; n],
            lengths: vec![b.seq_length; b.micro_batch_size],
            labels: b.labels.clone(),
            loss_mask: b.loss_mask.clone(),
            is_random: vec![-1; b.micro_batch_size],
            seed: b.seed,
        }
    }
}

impl Model for BertModel {
    fn name(&self) -> &str {
        "bert"
    }

    fn forward(&mut self, batch: &Batch, mode: Mode) -> Result<LossReport> {
        self.require_whole_model("forward")?;
        let x = self.batch_of(batch)?;
        let l = self.forward_bert(&x, mode)?;
        self.pending = (mode == Mode::Train).then_some(l);
        self.report(l, mode)
    }

    fn backward(&mut self, grad_scale: f32) -> Result<()> {
        self.require_whole_model("backward")?;
        let l = self.pending.take().context("bert backward called without a training forward")?;
        let (lm, sop) = self.scales(&l, grad_scale);
        self.backward_bert(lm, sop)
    }

    fn is_first_stage(&self) -> bool {
        self.embedding.is_some()
    }

    fn is_last_stage(&self) -> bool {
        self.ctx().is_last_stage()
    }

    fn stage_buffer(&self, batch: &Batch) -> Result<DeviceTensor> {
        // Stages exchange hidden states (and their gradient) in the activation dtype.
        self.backend().zeros(&self.stage_shape(batch), self.act_dtype())
    }

    fn forward_stage(
        &mut self,
        microbatch: usize,
        batch: &Batch,
        input: Option<DeviceTensor>,
        mode: Mode,
    ) -> Result<StageOutput> {
        if self.ctx().pp_size() == 1 && input.is_none() {
            return Ok(StageOutput::Loss(self.forward(batch, mode)?));
        }
        self.stage_forward(microbatch, batch, input, mode)
    }

    fn backward_stage(
        &mut self,
        microbatch: usize,
        grad_output: Option<DeviceTensor>,
        grad_scale: f32,
        on_grads_ready: GradsReadyHook,
    ) -> Result<Option<DeviceTensor>> {
        if self.ctx().pp_size() == 1 && grad_output.is_none() {
            self.backward(grad_scale)?;
            on_grads_ready(&self.params())?;
            return Ok(None);
        }
        self.stage_backward(microbatch, grad_output, grad_scale, on_grads_ready)
    }

    fn finalize_grads(&mut self) -> Result<()> {
        self.all_reduce_shared_embedding_grad()
    }

    fn take_metrics(&mut self) -> Vec<(String, f64)> {
        std::mem::take(&mut self.metrics)
    }

    fn take_eval_metrics(&mut self) -> Vec<(String, f64)> {
        std::mem::take(&mut self.eval_metrics)
    }

    fn logits(&mut self, tokens: &[i32], micro_batch_size: usize, seq_length: usize) -> Result<DeviceTensor> {
        self.require_whole_model("logits")?;
        if tokens.len() != micro_batch_size * seq_length {
            bail!("{} tokens given for a {micro_batch_size}x{seq_length} batch", tokens.len());
        }
        let n = tokens.len();
        let b = Batch {
            micro_batch_size,
            seq_length,
            tokens: tokens.to_vec(),
            labels: vec![0; n],
            loss_mask: vec![0.0; n],
            seed: 0,
        };
        let x = self.bert_batch(&b);
        self.forward_bert(&x, Mode::Eval)?;
        let logits = self.logits_tensor();
        let mut out = self.backend().zeros(logits.shape(), DType::F32)?;
        megatron_transformer::step::copy_any(self.backend().as_ref(), logits, &mut out)?;
        Ok(out)
    }

    fn params(&self) -> Vec<&Param> {
        BertModel::params(self)
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        BertModel::params_mut(self)
    }

    fn zero_grad(&mut self) -> Result<()> {
        self.zero_grads()
    }

    /// Megatron's dense-transformer count (SPEC §6.13) for an encoder: `24·B·T·L·h²·(1 +
    /// T/(6h)) + 6·B·T·h·V` (forward + backward, the LM projection over every position).
    fn flops_per_iteration(&self, samples: usize) -> f64 {
        let c = &self.config;
        let (l, h, t, v) = (
            c.num_layers as f64,
            c.hidden_size as f64,
            c.seq_length.unwrap_or(c.max_position_embeddings) as f64,
            c.vocab_size as f64,
        );
        let bt = samples as f64 * t;
        24.0 * bt * l * h * h * (1.0 + t / (6.0 * h)) + 6.0 * bt * h * v
    }
}

fn build_bert(de: ConfigDe, env: &ModelEnv) -> Result<Box<dyn Model>> {
    let config: BertConfig = parse_config(de, "bert")?;
    Ok(Box::new(BertModel::new(config, env.backend.clone(), env.ctx.clone())?))
}

fn plugins() -> Vec<Plugin> {
    vec![Plugin {
        name: "bert",
        description: "BERT encoder (padding-mask attention, token types, pre/post-LN, LM + sentence-order heads)",
        factory: Factory::Model(build_bert),
    }]
}

megatron_core::inventory::submit! {
    megatron_core::PluginCrate { crate_name: env!("CARGO_PKG_NAME"), version: env!("CARGO_PKG_VERSION"), plugins }
}
