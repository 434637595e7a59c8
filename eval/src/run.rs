//! The evaluation loop (Megatron's `tasks/zeroshot_gpt/evaluate.py`): micro batches of
//! samples in order (the last one may be smaller), logits from every TP rank (each rank runs in
//! its own thread, as ranks do), targets scored by [`crate::score`], summed over the dataset,
//! and reported as Megatron's result line plus a JSON summary.
//!
//! Batches are cut after the last scored position of their longest sample: a causal model's
//! outputs there do not depend on the padding behind it, so the scores equal those of the
//! full `seq_len` batches Megatron runs, at a fraction of the cost for short LAMBADA passages.

use crate::pyfmt::{repr, sci4};
use crate::score::{combine, slice_stats, SliceStats};
use crate::tasks::{EvalDataset, Task};
use anyhow::{bail, Context, Result};
use megatron_core::{Backend, Model};
use serde_json::{json, Value};
use std::sync::{mpsc, Arc};

/// One TP rank of the model under evaluation: host logits `(b, s, V_padded/tp)` of its vocab
/// slice (rank `r` of `tp` holds ids `[r·V/tp, (r+1)·V/tp)`).
pub trait LogitsRank: Send {
    fn host_logits(&mut self, tokens: &[i32], batch: usize, seq: usize) -> Result<Vec<f32>>;
}

/// Any [`Model`] with the backend its tensors live on.
pub struct ModelRank<M: Model> {
    pub model: M,
    pub backend: Arc<dyn Backend>,
}

impl<M: Model> LogitsRank for ModelRank<M> {
    fn host_logits(&mut self, tokens: &[i32], batch: usize, seq: usize) -> Result<Vec<f32>> {
        let logits = self.model.logits(tokens, batch, seq)?;
        Ok(self.backend.to_host(&logits)?.to_f32_vec())
    }
}

/// Evaluation settings besides the dataset.
#[derive(Clone, Copy, Debug)]
pub struct EvalOptions {
    pub micro_batch_size: usize,
    /// Unpadded vocabulary: larger ids are padding and never predicted.
    pub vocab_size: usize,
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
            }
        }
        v
    }
}

/// One micro batch, cut to its used length: inputs `(b, s)`, flat scored positions, labels.
struct MicroBatch {
    b: usize,
    s: usize,
    tokens: Vec<i32>,
    labels: Vec<i32>,
    positions: Vec<usize>,
}

fn micro_batch(ds: &EvalDataset, first: usize, count: usize) -> MicroBatch {
    let samples: Vec<_> = (first..first + count).map(|i| ds.sample(i)).collect();
    let s = samples.iter().map(|x| x.used_len()).max().unwrap_or(1);
    let mut mb = MicroBatch { b: count, s, tokens: Vec::new(), labels: Vec::new(), positions: Vec::new() };
    for (r, x) in samples.iter().enumerate() {
        mb.tokens.extend_from_slice(&x.tokens[..s]);
        mb.labels.extend_from_slice(&x.tokens[1..s + 1]);
        mb.positions.extend((0..s).filter(|&t| x.loss_mask[t] != 0.0).map(|t| r * s + t));
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
    if ranks.is_empty() {
        bail!("evaluation needs at least one model rank");
    }
    let mbs = opts.micro_batch_size.max(1);
    let n = ds.len();
    let batches = n.div_ceil(mbs);
    let tp = ranks.len();
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
    };
    std::thread::scope(|scope| -> Result<()> {
        let mut receivers = Vec::with_capacity(tp);
        for (r, mut rank) in ranks.into_iter().enumerate() {
            let (tx, rx) = mpsc::sync_channel::<Result<SliceStats>>(1);
            receivers.push(rx);
            scope.spawn(move || {
                for k in 0..batches {
                    let mb = micro_batch(ds, k * mbs, mbs.min(n - k * mbs));
                    let stats = rank.host_logits(&mb.tokens, mb.b, mb.s).and_then(|logits| {
                        let v_local = logits.len() / (mb.b * mb.s);
                        if v_local == 0 || logits.len() != mb.b * mb.s * v_local {
                            bail!("rank {r} returned {} logits for a {}x{} batch", logits.len(), mb.b, mb.s);
                        }
                        Ok(slice_stats(&logits, v_local, r * v_local, opts.vocab_size, &mb.positions, &mb.labels))
                    });
                    let failed = stats.is_err();
                    if tx.send(stats).is_err() || failed {
                        return; // the collector stopped (another rank failed) or this one did
                    }
                }
            });
        }
        for k in 0..batches {
            let mut slices = Vec::with_capacity(tp);
            for (r, rx) in receivers.iter().enumerate() {
                let s = rx.recv().context("a model rank stopped early")?;
                slices.push(s.with_context(|| format!("micro batch {k}, tensor-parallel rank {r}"))?);
            }
            let scores = combine(&slices);
            let mb = micro_batch(ds, k * mbs, mbs.min(n - k * mbs));
            result.scored_targets += scores.len();
            match ds.task {
                Task::Wikitext103 => result.output += scores.iter().map(|x| x.nll).sum::<f64>(),
                Task::Lambada => {
                    // A sample is correct iff the argmax equals the label at every target.
                    let mut ok = vec![true; mb.b];
                    for (sc, &p) in scores.iter().zip(&mb.positions) {
                        ok[p / mb.s] &= sc.argmax as i32 == mb.labels[p];
                    }
                    result.output += ok.iter().filter(|&&x| x).count() as f64;
                    result.correct.extend(ok);
                }
            }
            progress(k + 1, batches);
        }
        Ok(())
    })?;
    result.seconds = start.elapsed().as_secs_f64();
    Ok(result)
}
