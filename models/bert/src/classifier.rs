//! [`BertClassifier`]: Megatron's `Classification` model for GLUE finetuning (SPEC §9.4): the
//! BERT encoder, the pooler on `[CLS]` (from the pretrained model when it has one) and a
//! `classification_head` linear to `classes` logits, cross-entropy per row. The pretraining
//! heads (LM head, sentence-order linear) are dropped from the trained parameter set.
//! As Megatron, training applies dropout (the encoder's `hidden_dropout`) to the pooled output
//! before the head, with a mask drawn from the batch seed.

use crate::heads::{class_cross_entropy, BinaryHead};
use crate::model::{BertBatch, BertModel};
use anyhow::{bail, Context, Result};
use megatron_core::{Mode, Param};
use megatron_transformer::ModuleBuilder;

pub struct BertClassifier {
    pub bert: BertModel,
    /// `pooler.dense` + `classification_head` (`(classes, C)`).
    pub head: BinaryHead,
    classes: usize,
    /// `d Σloss / d logits` of the saved training forward `(B, classes)`.
    d_logits: Option<Vec<f32>>,
}

/// What one forward gives: the summed cross-entropy and each row's predicted class.
pub struct ClassifierOutput {
    pub loss_sum: f64,
    pub predictions: Vec<usize>,
    /// `(B, classes)` row-major.
    pub logits: Vec<f32>,
}

impl BertClassifier {
    /// Wraps a (pretrained) model; its pooler, if any, initialises ours; the head is fresh
    /// (`seed` drives its init).
    pub fn new(mut bert: BertModel, classes: usize, seed: u64) -> Result<BertClassifier> {
        if classes < 2 {
            bail!("a classification head needs at least 2 classes (got {classes})");
        }
        let c = bert.config().clone();
        let b = ModuleBuilder::new(bert.backend(), bert.ctx().clone(), seed);
        let mut head = BinaryHead::with_classes(&b, c.hidden_size, c.init_method_std, classes, "classification_head")?;
        if let Some(pretrained) = bert.binary_head.take() {
            head.pooler_weight = pretrained.pooler_weight;
            head.pooler_bias = pretrained.pooler_bias;
        }
        Ok(BertClassifier { bert, head, classes, d_logits: None })
    }

    pub fn classes(&self) -> usize {
        self.classes
    }

    /// Rows of `x` (its `is_random` are the class labels, −1 = unlabelled); in
    /// [`Mode::Train`] keeps what [`Self::backward`] needs.
    pub fn forward(&mut self, x: &BertBatch, mode: Mode) -> Result<ClassifierOutput> {
        if x.is_random.len() != x.batch || x.is_random.iter().any(|&l| l >= self.classes as i32) {
            bail!("classifier batch: one label in [-1, {}) per row is needed ({:?})", self.classes, x.is_random);
        }
        self.d_logits = None;
        self.bert.forward_encoder(x, mode)?;
        let bk = self.bert.backend();
        let hidden = bk.to_host(self.bert.hidden_states())?.to_f32_vec();
        let p = self.bert.config().hidden_dropout;
        // The pooled-output mask: its own stream of the microbatch seed.
        let dropout = (mode == Mode::Train && p > 0.0).then_some((p, x.seed ^ 0xC1A5_5D20_0000_0000));
        let logits = self.head.forward_with_dropout(bk.as_ref(), &hidden, x.batch, x.seq, dropout)?;
        let (loss_sum, _, d) = class_cross_entropy(&logits, &x.is_random, self.classes);
        let predictions = logits
            .chunks(self.classes)
            .map(|row| row.iter().enumerate().fold(0, |best, (k, &v)| if v > row[best] { k } else { best }))
            .collect();
        if mode == Mode::Train {
            self.d_logits = Some(d);
        }
        Ok(ClassifierOutput { loss_sum, predictions, logits })
    }

    /// Backpropagates `scale · Σ loss` of the saved forward (scale = 1/rows for the mean).
    pub fn backward(&mut self, scale: f32) -> Result<()> {
        let d = self.d_logits.take().context("BertClassifier::backward without a training forward")?;
        let bk = self.bert.backend();
        let d_cls = self.head.backward(bk.as_ref(), d.iter().map(|v| v * scale).collect())?;
        let shape = self.bert.hidden_states().shape().to_vec();
        let (b, t, c) = (shape[0], shape[1], shape[2]);
        let mut d_hidden = vec![0.0f32; b * t * c];
        for r in 0..b {
            d_hidden[r * t * c..r * t * c + c].copy_from_slice(&d_cls[r * c..(r + 1) * c]);
        }
        self.bert.backward_encoder(d_hidden)
    }

    /// The trained parameters: the encoder (without the LM head) and pooler + head.
    pub fn params(&self) -> Vec<&Param> {
        let mut p: Vec<&Param> = self.bert.params().into_iter().filter(|p| !is_lm_head(&p.name)).collect();
        p.extend(self.head.params());
        p
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut p: Vec<&mut Param> = self.bert.params_mut().into_iter().filter(|p| !is_lm_head(&p.name)).collect();
        p.extend(self.head.params_mut());
        p
    }
}

fn is_lm_head(name: &str) -> bool {
    name.starts_with("lm_head.") || name == "output_layer.bias"
}
