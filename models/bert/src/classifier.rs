//! [`BertClassifier`]: Megatron's `Classification` model for GLUE finetuning (SPEC §9.4): the
//! BERT encoder, the pooler on `[CLS]` (from the pretrained model when it has one) and a
//! `classification_head` linear to `classes` logits, cross-entropy per row. The pretraining
//! heads (LM head, sentence-order linear) are dropped from the trained parameter set.
//! As Megatron, training applies dropout (the encoder's `hidden_dropout`) to the pooled output
//! before the head, with a mask drawn from the batch seed.
//!
//! [`BertClassifier::multiple_choice`] is Megatron's `MultipleChoice` model (RACE, SPEC §9.3):
//! the rows of a batch come in groups of `choices` (one row per option of a question), a
//! `multichoice_head` linear gives one score per row, and the cross-entropy is a softmax over
//! each group's scores (Hugging Face's `BertForMultipleChoice` is the same computation).

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
    /// Rows per example: 1 (classification) or the options per question (multiple choice).
    choices: usize,
    /// `d Σloss / d logits` of the saved training forward `(B, classes)`.
    d_logits: Option<Vec<f32>>,
}

/// What one forward gives: the summed cross-entropy and each example's predicted class
/// (row = example for classification; a group of `choices` rows for multiple choice).
pub struct ClassifierOutput {
    pub loss_sum: f64,
    pub predictions: Vec<usize>,
    /// `(examples, ways)` row-major: `(B, classes)`, or `(B / choices, choices)`.
    pub logits: Vec<f32>,
}

impl BertClassifier {
    /// Wraps a (pretrained) model; its pooler, if any, initialises ours; the head is fresh
    /// (`seed` drives its init).
    pub fn new(bert: BertModel, classes: usize, seed: u64) -> Result<BertClassifier> {
        if classes < 2 {
            bail!("a classification head needs at least 2 classes (got {classes})");
        }
        BertClassifier::with_head(bert, classes, "classification_head", seed)
    }

    /// Megatron's `MultipleChoice` model: one `multichoice_head` score per row, a softmax over
    /// each group of `choices` consecutive rows (one question); the pooler as in [`Self::new`].
    pub fn multiple_choice(bert: BertModel, choices: usize, seed: u64) -> Result<BertClassifier> {
        if choices < 2 {
            bail!("a multiple-choice head needs at least 2 options per question (got {choices})");
        }
        let mut m = BertClassifier::with_head(bert, 1, "multichoice_head", seed)?;
        m.choices = choices;
        Ok(m)
    }

    fn with_head(mut bert: BertModel, classes: usize, name: &str, seed: u64) -> Result<BertClassifier> {
        let c = bert.config().clone();
        let b = ModuleBuilder::new(bert.backend(), bert.ctx().clone(), seed);
        let mut head = BinaryHead::with_classes(&b, c.hidden_size, c.init_method_std, classes, name)?;
        if let Some(pretrained) = bert.binary_head.take() {
            head.pooler_weight = pretrained.pooler_weight;
            head.pooler_bias = pretrained.pooler_bias;
        }
        Ok(BertClassifier { bert, head, classes, choices: 1, d_logits: None })
    }

    pub fn classes(&self) -> usize {
        self.classes
    }

    /// Rows per example (1 for classification).
    pub fn choices(&self) -> usize {
        self.choices
    }

    /// The softmax width: the classes, or the options of a question.
    pub fn ways(&self) -> usize {
        if self.choices > 1 {
            self.choices
        } else {
            self.classes
        }
    }

    /// Rows of `x` (its `is_random` are the class labels, −1 = unlabelled; with multiple
    /// choice every row of a question carries the question's answer); in [`Mode::Train`]
    /// keeps what [`Self::backward`] needs.
    pub fn forward(&mut self, x: &BertBatch, mode: Mode) -> Result<ClassifierOutput> {
        let (group, ways) = (self.choices, self.ways());
        if x.is_random.len() != x.batch || x.is_random.iter().any(|&l| l >= ways as i32) {
            bail!("classifier batch: one label in [-1, {ways}) per row is needed ({:?})", x.is_random);
        }
        if !x.batch.is_multiple_of(group) || x.is_random.chunks(group).any(|g| g.iter().any(|&l| l != g[0])) {
            bail!(
                "multiple-choice batch: {} rows must form groups of {group} (one per option) sharing a label ({:?})",
                x.batch,
                x.is_random
            );
        }
        let labels: Vec<i32> = x.is_random.iter().step_by(group).copied().collect();
        self.d_logits = None;
        self.bert.forward_encoder(x, mode)?;
        let bk = self.bert.backend();
        let hidden = bk.to_host(self.bert.hidden_states())?.to_f32_vec();
        let p = self.bert.config().hidden_dropout;
        // The pooled-output mask: its own stream of the microbatch seed.
        let dropout = (mode == Mode::Train && p > 0.0).then_some((p, x.seed ^ 0xC1A5_5D20_0000_0000));
        // (B, classes); with multiple choice (B, 1) = (B / choices, choices) row-major.
        let logits = self.head.forward_with_dropout(bk.as_ref(), &hidden, x.batch, x.seq, dropout)?;
        let (loss_sum, _, d) = class_cross_entropy(&logits, &labels, ways);
        let predictions = logits
            .chunks(ways)
            .map(|row| row.iter().enumerate().fold(0, |best, (k, &v)| if v > row[best] { k } else { best }))
            .collect();
        if mode == Mode::Train {
            self.d_logits = Some(d);
        }
        Ok(ClassifierOutput { loss_sum, predictions, logits })
    }

    /// Backpropagates `scale · Σ loss` of the saved forward (scale = 1/examples for the mean).
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
