//! LAMBADA under both rules (non-strict and `--strict-lambada`) from shared forwards.
//!
//! The two rules split a passage differently (the last token; `" " + last word`), but when
//! the strict split tokenizes to the same ids as the whole passage — almost always with a
//! BPE tokenizer that puts the space in front of a word — both targets are suffixes of the
//! same sequence, and one forward scores both: the non-strict target is the last position,
//! the strict one the last word's positions. Passages whose strict ids differ get a second
//! sequence of their own.
//!
//! The sequences are then batched by length (sorted, stable by passage), so a micro batch
//! carries little padding, and only the scored rows go through the output layer. Each rule's
//! result is reported in file order, exactly as [`crate::evaluate`] reports one rule's
//! [`crate::tasks::EvalDataset::cloze`]: the samples are built by that same code.

use crate::batches::{score_batches, LogitsRank, RowBatch};
use crate::run::{EvalOptions, EvalResult};
use crate::tasks::{EvalDataset, Task};
use anyhow::Result;
use megatron_core::Tokenizer;
use std::collections::HashMap;

/// One forward's sequence and what it scores.
struct Job {
    /// Input ids up to the last scored position, plus the last target (`used + 1` ids).
    tokens: Vec<i32>,
    /// `(rule, example, scored positions)`; rule 0 non-strict, 1 strict.
    scored: Vec<(usize, usize, Vec<usize>)>,
}

impl Job {
    fn used(&self) -> usize {
        self.tokens.len() - 1
    }
}

/// Both rules' LAMBADA samples of `texts`, sharing sequences where the ids are equal.
pub struct ClozeBoth {
    pub examples: usize,
    /// Examples whose context was cut on the left, per rule.
    pub truncated: [usize; 2],
    /// Passages scored by one forward for both rules.
    pub shared: usize,
    pad: i32,
    jobs: Vec<Job>,
}

impl ClozeBoth {
    pub fn new(texts: &[String], tokenizer: &dyn Tokenizer, seq_len: usize, pad: i32) -> Result<ClozeBoth> {
        let rules = [
            EvalDataset::cloze(texts, tokenizer, seq_len, pad, false)?,
            EvalDataset::cloze(texts, tokenizer, seq_len, pad, true)?,
        ];
        let mut jobs = Vec::new();
        let mut shared = 0;
        for i in 0..texts.len() {
            let samples = [rules[0].sample(i), rules[1].sample(i)];
            let job = |rule: usize| {
                let x = &samples[rule];
                let used = x.used_len();
                let positions = (0..used).filter(|&t| x.loss_mask[t] != 0.0).collect();
                Job { tokens: x.tokens[..used + 1].to_vec(), scored: vec![(rule, i, positions)] }
            };
            let (mut a, b) = (job(0), job(1));
            if a.tokens == b.tokens {
                a.scored.extend(b.scored);
                jobs.push(a);
                shared += 1;
            } else {
                jobs.push(a);
                jobs.push(b);
            }
        }
        // By length, stable: equal lengths keep passage order.
        jobs.sort_by_key(|j| j.used());
        Ok(ClozeBoth { examples: texts.len(), truncated: [rules[0].truncated, rules[1].truncated], shared, pad, jobs })
    }

    /// Forwards needed (at micro batch 1).
    pub fn sequences(&self) -> usize {
        self.jobs.len()
    }

    /// Micro batch `first..first + count` of the sorted sequences, cut to its longest.
    fn batch(&self, first: usize, count: usize) -> RowBatch {
        let jobs = &self.jobs[first..first + count];
        let s = jobs.iter().map(Job::used).max().unwrap_or(1);
        let mut mb =
            RowBatch { b: count, s, tokens: Vec::with_capacity(count * s), rows: Vec::new(), labels: Vec::new() };
        for (r, j) in jobs.iter().enumerate() {
            mb.tokens.extend_from_slice(&j.tokens[..j.used()]);
            mb.tokens.resize((r + 1) * s, self.pad);
            let mut ts: Vec<usize> = j.scored.iter().flat_map(|(_, _, p)| p.iter().copied()).collect();
            ts.sort_unstable();
            ts.dedup();
            for t in ts {
                mb.rows.push(r * s + t);
                mb.labels.push(j.tokens[t + 1]);
            }
        }
        mb
    }

    /// Evaluates both rules: `[non-strict, strict]`, each in file order. Both results carry the
    /// whole run's time (`seconds`): one run produced both.
    pub fn evaluate(
        &self,
        ranks: Vec<Box<dyn LogitsRank + '_>>,
        opts: EvalOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<[EvalResult; 2]> {
        let mbs = opts.micro_batch_size.max(1);
        let n = self.jobs.len();
        let batches = n.div_ceil(mbs);
        let start = std::time::Instant::now();
        let mut correct = [vec![false; self.examples], vec![false; self.examples]];
        let mut nll = [vec![0.0f64; self.examples], vec![0.0f64; self.examples]];
        let mut scored = [0usize; 2];
        let make = |k: usize| self.batch(k * mbs, mbs.min(n - k * mbs));
        score_batches(ranks, batches, &make, opts.rows(), &mut |k, mb, scores| {
            let at: HashMap<usize, usize> = mb.rows.iter().enumerate().map(|(i, &p)| (p, i)).collect();
            for (r, job) in self.jobs[k * mbs..k * mbs + mb.b].iter().enumerate() {
                for (rule, example, positions) in &job.scored {
                    let mut ok = true;
                    let mut sum = 0.0;
                    for &t in positions {
                        let sc = scores[at[&(r * mb.s + t)]];
                        ok &= sc.argmax as i32 == job.tokens[t + 1];
                        sum += sc.nll;
                    }
                    correct[*rule][*example] = ok;
                    nll[*rule][*example] = sum;
                    scored[*rule] += positions.len();
                }
            }
            progress(k + 1, batches);
            Ok(())
        })?;
        let seconds = start.elapsed().as_secs_f64();
        let result = |rule: usize| EvalResult {
            task: Task::Lambada,
            samples: self.examples,
            output: correct[rule].iter().filter(|&&c| c).count() as f64,
            num_tokenized_tokens: self.examples,
            num_original_tokens: self.examples,
            scored_targets: scored[rule],
            seconds,
            correct: correct[rule].clone(),
            nll: nll[rule].clone(),
        };
        Ok([result(0), result(1)])
    }
}
