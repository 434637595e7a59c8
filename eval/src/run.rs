//! The evaluation loop (Megatron's `tasks/zeroshot_gpt/evaluate.py`): micro batches of
//! samples in order (the last one may be smaller), logits from every TP rank (each rank runs in
//! its own thread, as ranks do), targets scored by [`crate::score`], summed over the dataset,
//! and reported as Megatron's result line plus a JSON summary.
//!
//! Batches are cut after the last scored position of their longest sample: a causal model's
//! outputs there do not depend on the padding behind it, so the scores equal those of the
//! full `seq_len` batches Megatron runs, at a fraction of the cost for short LAMBADA passages.

use crate::batches::{score_batches, RowBatch, RowOptions};
pub use crate::batches::{LogitsRank, ModelRank};
use crate::pyfmt::{repr, sci4};
use crate::tasks::{EvalDataset, Task};
use anyhow::Result;
use serde_json::{json, Value};

/// Evaluation settings besides the dataset.
#[derive(Clone, Copy, Debug)]
pub struct EvalOptions {
    pub micro_batch_size: usize,
    /// Unpadded vocabulary: larger ids are padding and never predicted.
    pub vocab_size: usize,
    /// Compute the whole `(b, s, V/tp)` logits and pick the scored rows on the host (the
    /// original path) instead of running the output layer on the scored rows only.
    pub full_logits: bool,
}

impl EvalOptions {
    /// Partial logits (the output layer on the scored rows only).
    pub fn new(micro_batch_size: usize, vocab_size: usize) -> EvalOptions {
        EvalOptions { micro_batch_size, vocab_size, full_logits: false }
    }

    pub(crate) fn rows(&self) -> RowOptions {
        RowOptions { vocab_size: self.vocab_size, full_logits: self.full_logits }
    }
}

/// What an evaluation produced (SPEC §9.1–9.2).
#[derive(Clone, Debug, PartialEq)]
pub struct EvalResult {
    pub task: Task,
    /// Samples evaluated (windows or examples).
    pub samples: usize,
    /// WikiText: summed target NLL (nats); LAMBADA: number of examples fully correct.
    pub output: f64,
    pub num_tokenized_tokens: usize,
    pub num_original_tokens: usize,
    pub scored_targets: usize,
    pub seconds: f64,
    /// LAMBADA: whether each example was fully correct (in file order).
    pub correct: Vec<bool>,
    /// Per sample (file order): the summed `-log p` of its scored targets.
    pub nll: Vec<f64>,
}

impl EvalResult {
    /// `(val_loss, ppl, adjusted_ppl, token_ratio)` of a perplexity task.
    pub fn perplexity(&self) -> (f64, f64, f64, f64) {
        let val_loss = self.output / (self.num_tokenized_tokens as f64 - 1.0);
        let token_ratio = (self.num_tokenized_tokens as f64 - 1.0) / (self.num_original_tokens as f64 - 1.0);
        (val_loss, val_loss.min(20.0).exp(), (val_loss * token_ratio).min(20.0).exp(), token_ratio)
    }

    pub fn accuracy(&self) -> f64 {
        self.output / self.samples as f64
    }

    /// Megatron's result line (between two lines of dashes as long as it, plus one).
    pub fn result_line(&self) -> String {
        let mut s = format!(" validation results on {} | ", self.task.name());
        match self.task {
            Task::Wikitext103 => {
                let (loss, ppl, adj, ratio) = self.perplexity();
                s += &format!(
                    "avg loss: {} | ppl: {} | adjusted ppl: {} | token ratio: {} |",
                    sci4(loss),
                    sci4(ppl),
                    sci4(adj),
                    repr(ratio)
                );
            }
            Task::Lambada => {
                s += &format!(
                    "number correct: {} | total examples: {} | avg accuracy: {}",
                    sci4(self.output),
                    sci4(self.samples as f64),
                    sci4(self.accuracy())
                );
            }
        }
        s
    }

    /// The printed block: dashes, the result line, dashes.
    pub fn report(&self) -> String {
        let line = self.result_line();
        let dashes = "-".repeat(line.chars().count() + 1);
        format!("{dashes}\n{line}\n{dashes}")
    }

    pub fn json(&self) -> Value {
        let per_sample = self.seconds / self.samples.max(1) as f64;
        let mut v = json!({
            "task": self.task.name(),
            "samples": self.samples,
            "scored_targets": self.scored_targets,
            "seconds": self.seconds,
            "seconds_per_sample": per_sample,
        });
        match self.task {
            Task::Wikitext103 => {
                let (loss, ppl, adj, ratio) = self.perplexity();
                v["avg_loss"] = json!(loss);
                v["ppl"] = json!(ppl);
                v["adjusted_ppl"] = json!(adj);
                v["token_ratio"] = json!(ratio);
                v["num_tokenized_tokens"] = json!(self.num_tokenized_tokens);
                v["num_original_tokens"] = json!(self.num_original_tokens);
            }
            Task::Lambada => {
                v["number_correct"] = json!(self.output);
                v["total_examples"] = json!(self.samples);
                v["accuracy"] = json!(self.accuracy());
                v["correct"] = json!(self.correct.iter().map(|&c| c as u8).collect::<Vec<_>>());
                v["target_nll"] = json!(self.nll);
            }
        }
        v
    }
}

/// Micro batch `first..first + count` in file order, cut to its used length.
fn micro_batch(ds: &EvalDataset, first: usize, count: usize) -> RowBatch {
    let samples: Vec<_> = (first..first + count).map(|i| ds.sample(i)).collect();
    let s = samples.iter().map(|x| x.used_len()).max().unwrap_or(1);
    let mut mb = RowBatch { b: count, s, tokens: Vec::new(), rows: Vec::new(), labels: Vec::new() };
    for (r, x) in samples.iter().enumerate() {
        mb.tokens.extend_from_slice(&x.tokens[..s]);
        for t in (0..s).filter(|&t| x.loss_mask[t] != 0.0) {
            mb.rows.push(r * s + t);
            mb.labels.push(x.tokens[t + 1]);
        }
    }
    mb
}

/// Runs `ds` through the TP ranks `ranks` (rank order = vocab slice order); `progress(done,
/// total)` is called after every micro batch.
pub fn evaluate(
    ranks: Vec<Box<dyn LogitsRank + '_>>,
    ds: &EvalDataset,
    opts: EvalOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<EvalResult> {
    let mbs = opts.micro_batch_size.max(1);
    let n = ds.len();
    let batches = n.div_ceil(mbs);
    let start = std::time::Instant::now();
    let mut result = EvalResult {
        task: ds.task,
        samples: n,
        output: 0.0,
        num_tokenized_tokens: ds.num_tokenized_tokens,
        num_original_tokens: ds.num_original_tokens,
        scored_targets: 0,
        seconds: 0.0,
        correct: Vec::new(),
        nll: Vec::new(),
    };
    let make = |k: usize| micro_batch(ds, k * mbs, mbs.min(n - k * mbs));
    score_batches(ranks, batches, &make, opts.rows(), &mut |k, mb, scores| {
        result.scored_targets += scores.len();
        // Per sample: summed loss, and correct iff the argmax equals the label at every target.
        let mut ok = vec![true; mb.b];
        let mut nll = vec![0.0f64; mb.b];
        for ((sc, &p), &label) in scores.iter().zip(&mb.rows).zip(&mb.labels) {
            ok[p / mb.s] &= sc.argmax as i32 == label;
            nll[p / mb.s] += sc.nll;
        }
        match ds.task {
            Task::Wikitext103 => result.output += scores.iter().map(|x| x.nll).sum::<f64>(),
            Task::Lambada => {
                result.output += ok.iter().filter(|&&x| x).count() as f64;
                result.correct.extend(ok);
            }
        }
        result.nll.extend(nll);
        progress(k + 1, batches);
        Ok(())
    })?;
    result.seconds = start.elapsed().as_secs_f64();
    Ok(result)
}
