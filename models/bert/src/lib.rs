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
//!   loss averaged over data-parallel ranks (the log line's `sop loss`);
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

pub use classifier::{BertClassifier, ClassifierOutput};
pub use config::{BertConfig, LayerNormPlacement};
pub use model::{BertBatch, BertLosses, BertModel};

use anyhow::{bail, Context};
use megatron_core::registry::{parse_config, ConfigDe, ModelEnv};
use megatron_core::{Batch, DType, DeviceTensor, Factory, LossReport, Mode, Model, Param, Plugin, Result};

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
        let Some(seq) = self.config.seq_length else {
            let x = self.bert_batch(batch);
            let l = self.forward_bert(&x, mode)?;
            return Ok(LossReport { loss_sum: l.lm_loss_sum, num_tokens: l.lm_tokens });
        };
        let x = BertBatch::unpack(batch, seq)?;
        let l = self.forward_bert(&x, mode)?;
        self.pending = None;
        if mode == Mode::Train {
            self.pending = Some(l);
            if self.binary_head.is_some() {
                // Megatron logs the sop loss averaged over the data-parallel group; every DP
                // rank runs the same number of training forwards, so this collective pairs up.
                let ctx = self.ctx();
                let mut sop = [l.sop_loss_sum / l.sop_rows.max(1.0)];
                ctx.comm.all_reduce_f64(&ctx.dp_group, &mut sop, megatron_core::ReduceOp::Sum)?;
                let sop = sop[0] / ctx.dp_size() as f64;
                self.metrics.push(("sop loss".to_string(), sop));
            }
        }
        Ok(LossReport { loss_sum: l.lm_loss_sum / l.lm_tokens.max(1.0), num_tokens: 1.0 })
    }

    fn backward(&mut self, grad_scale: f32) -> Result<()> {
        if self.config.seq_length.is_none() {
            return self.backward_bert(grad_scale, 0.0);
        }
        let l = self.pending.take().context("bert backward called without a training forward")?;
        // d(lm + sop)/d(per-token ce) = scale/Σmask at masked positions; per-row sop: scale/rows.
        let (lm, sop) = (grad_scale as f64 / l.lm_tokens.max(1.0), grad_scale as f64 / l.sop_rows.max(1.0));
        self.backward_bert(lm as f32, sop as f32)
    }

    fn take_metrics(&mut self) -> Vec<(String, f64)> {
        std::mem::take(&mut self.metrics)
    }

    fn logits(&mut self, tokens: &[i32], micro_batch_size: usize, seq_length: usize) -> Result<DeviceTensor> {
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
        self.backend().copy(logits, &mut out)?;
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
