//! Scored samples of the two zero-shot tasks (SPEC §9.1–9.2). Every sample is `seq_len + 1`
//! token ids (padded with eod) and a loss mask over the `seq_len` targets `tokens[1..]`.
//!
//! * WikiText-103 / any text: sliding windows of `seq_len + 1` tokens with stride
//!   `overlapping_eval`; window `i > 0` scores only its last `stride` targets, so every target
//!   is scored once, with as much left context as the window allows.
//! * LAMBADA: context + target; non-strict the target is the last token of the whole text,
//!   strict (`--strict-lambada`) the tokens of `" " + last word`.

use anyhow::{bail, Context, Result};
use megatron_core::Tokenizer;

/// The two tasks of Megatron's `tasks/main.py` that evaluate causal LMs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Task {
    /// Perplexity (metric: loss).
    Wikitext103,
    /// Cloze accuracy (metric: accuracy).
    Lambada,
}

impl Task {
    /// Megatron's `--task` names.
    pub fn parse(name: &str) -> Result<Task> {
        match name {
            "WIKITEXT103" => Ok(Task::Wikitext103),
            "LAMBADA" => Ok(Task::Lambada),
            other => bail!("unknown --task `{other}`: the evaluation tasks are WIKITEXT103 and LAMBADA"),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Task::Wikitext103 => "WIKITEXT103",
            Task::Lambada => "LAMBADA",
        }
    }
}

/// One model input: `tokens` (`seq_len + 1` ids) and the mask of the scored targets
/// (`seq_len` entries, 1.0 where `tokens[t + 1]` is scored).
#[derive(Clone, Debug, PartialEq)]
pub struct EvalSample {
    pub tokens: Vec<i32>,
    pub loss_mask: Vec<f32>,
}

impl EvalSample {
    /// One past the last scored input position: a causal model's outputs before it do not
    /// depend on the padding after it, so a batch may be cut there.
    pub fn used_len(&self) -> usize {
        self.loss_mask.iter().rposition(|&m| m != 0.0).map_or(1, |p| p + 1)
    }
}

enum Items {
    /// The whole token stream and the window stride.
    Windows { tokens: Vec<i32>, stride: usize },
    /// `(context, target)` per example.
    Cloze(Vec<(Vec<i32>, Vec<i32>)>),
}

/// A task's samples, built on demand from the tokenized data.
pub struct EvalDataset {
    pub task: Task,
    pub seq_len: usize,
    pub pad: i32,
    /// WikiText: whitespace-separated words of the raw text (`len(text.strip().split(" "))`).
    pub num_original_tokens: usize,
    /// WikiText: tokens of the (detokenized) text.
    pub num_tokenized_tokens: usize,
    /// LAMBADA: examples whose context was cut on the left to fit `seq_len + 1`.
    pub truncated: usize,
    items: Items,
}

fn encode(tokenizer: &dyn Tokenizer, text: &str, what: &str) -> Result<Vec<i32>> {
    let ids = tokenizer.encode(text).with_context(|| format!("tokenizing {what}"))?;
    Ok(ids.into_iter().map(|t| t as i32).collect())
}

impl EvalDataset {
    /// Sliding windows over `text` (SPEC §9.1). `overlapping_eval`: the stride (`None` ⇒
    /// `seq_len`, at least 1). The word count is taken before `detokenize` is applied.
    pub fn windows(
        text: &str,
        tokenizer: &dyn Tokenizer,
        seq_len: usize,
        pad: i32,
        overlapping_eval: Option<usize>,
        detokenize: Option<fn(&str) -> String>,
    ) -> Result<EvalDataset> {
        let num_original_tokens = text.trim_matches(|c: char| c.is_whitespace()).split(' ').count();
        let tokens = match detokenize {
            Some(f) => encode(tokenizer, &f(text), "the detokenized text")?,
            None => encode(tokenizer, text, "the text")?,
        };
        Self::from_tokens(tokens, num_original_tokens, seq_len, pad, overlapping_eval)
    }

    /// [`EvalDataset::windows`] over an already tokenized stream.
    pub fn from_tokens(
        tokens: Vec<i32>,
        num_original_tokens: usize,
        seq_len: usize,
        pad: i32,
        overlapping_eval: Option<usize>,
    ) -> Result<EvalDataset> {
        if seq_len == 0 {
            bail!("--seq-length must be positive");
        }
        if tokens.len() < 2 || num_original_tokens < 2 {
            bail!(
                "the evaluation text has {} tokens ({num_original_tokens} words): perplexity needs at least 2 of each",
                tokens.len()
            );
        }
        let stride = overlapping_eval.unwrap_or(seq_len).clamp(1, seq_len);
        Ok(EvalDataset {
            task: Task::Wikitext103,
            seq_len,
            pad,
            num_original_tokens,
            num_tokenized_tokens: tokens.len(),
            truncated: 0,
            items: Items::Windows { tokens, stride },
        })
    }

    /// LAMBADA examples from whole texts (SPEC §9.2).
    pub fn cloze(
        texts: &[String],
        tokenizer: &dyn Tokenizer,
        seq_len: usize,
        pad: i32,
        strict: bool,
    ) -> Result<EvalDataset> {
        let mut items = Vec::with_capacity(texts.len());
        let mut truncated = 0;
        for (i, text) in texts.iter().enumerate() {
            let (mut context, target) = split_cloze(text, tokenizer, strict).with_context(|| format!("example {i}"))?;
            if target.is_empty() || target.len() > seq_len {
                bail!("example {i}: its target has {} tokens; it must have 1 to seq_len ({seq_len})", target.len());
            }
            if context.len() + target.len() < 2 {
                bail!("example {i}: a single token leaves nothing to predict it from");
            }
            let room = seq_len + 1 - target.len();
            if context.len() > room {
                context.drain(..context.len() - room);
                truncated += 1;
            }
            items.push((context, target));
        }
        if items.is_empty() {
            bail!("the LAMBADA file has no examples");
        }
        let n = items.len();
        Ok(EvalDataset {
            task: Task::Lambada,
            seq_len,
            pad,
            num_original_tokens: n,
            num_tokenized_tokens: n,
            truncated,
            items: Items::Cloze(items),
        })
    }

    pub fn len(&self) -> usize {
        match &self.items {
            Items::Windows { tokens, stride } => {
                let targets = tokens.len() - 1;
                (targets.saturating_sub(*stride)).div_ceil(*stride) + 1
            }
            Items::Cloze(items) => items.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sample `idx` (`idx < len()`).
    pub fn sample(&self, idx: usize) -> EvalSample {
        let s = self.seq_len;
        let (mut tokens, mut mask) = match &self.items {
            Items::Windows { tokens, stride } => {
                let start = (idx * stride).min(tokens.len());
                let window = tokens[start..(start + s + 1).min(tokens.len())].to_vec();
                let mut mask = vec![1.0f32; window.len().saturating_sub(1)];
                if *stride != s && idx != 0 {
                    // Only the last `stride` targets of the padded window count.
                    let keep_from = s - stride;
                    mask.iter_mut().take(keep_from).for_each(|m| *m = 0.0);
                }
                (window, mask)
            }
            Items::Cloze(items) => {
                let (context, target) = &items[idx];
                let mut tokens = context.clone();
                tokens.extend_from_slice(target);
                // Megatron's mask over `tokens` shifted by one: with an empty context the
                // first target token has nothing before it and is not scored.
                let mut mask = vec![0.0f32; context.len()];
                mask.extend(std::iter::repeat_n(1.0, target.len()));
                mask.remove(0);
                (tokens, mask)
            }
        };
        tokens.resize(s + 1, self.pad);
        mask.resize(s, 0.0);
        EvalSample { tokens, loss_mask: mask }
    }
}

/// `(context, target)` of one LAMBADA text.
pub fn split_cloze(text: &str, tokenizer: &dyn Tokenizer, strict: bool) -> Result<(Vec<i32>, Vec<i32>)> {
    if !strict {
        let mut tokens = encode(tokenizer, text, "the text")?;
        let Some(last) = tokens.pop() else { bail!("the text is empty") };
        return Ok((tokens, vec![last]));
    }
    let Some(word) = text.split_whitespace().next_back() else { bail!("the text has no words") };
    let start = text.rfind(word).unwrap_or(0);
    let context = encode(tokenizer, text[..start].trim(), "the context")?;
    let target = encode(tokenizer, &format!(" {word}"), "the last word")?;
    Ok((context, target))
}
