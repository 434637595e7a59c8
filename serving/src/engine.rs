//! Continuous (in-flight) batching: ONE loop on the model thread over a slotted kv cache
//! ([`megatron_gpt::SlotKvCache`]), one slot per in-flight sequence.
//!
//! Each step the loop retires sequences that finished (a stop token, their `max_tokens`) or
//! were cancelled (a client that went away, a stop string found by the HTTP side), admits
//! queued sequences into the freed slots, feeds prompt tokens of the sequences still being
//! prefilled — several prompts per model call, a long prompt in chunks over several steps, at
//! most [`EngineConfig::prefill_tokens`] per step ([`prefill`]) — and runs the shared decode
//! step, where every sequence whose prompt is in advances by one token at its own position. A
//! sequence samples its first token from the logits of its last prompt token. Every sequence
//! keeps its own sampling settings and its own seeded generator, so its tokens depend only on
//! its prompt, settings and seed — not on which sequences share its calls or how its prompt
//! was chunked (padding never reaches a real token, and each row's arithmetic does not depend
//! on the others: only the last bits of a log-prob may change with a call's row count, through
//! the GEMM's blocking; `tests/serve_continuous.rs` and `tests/serve_prefill.rs` check it).
//!
//! Back-pressure: the queue in front of the loop is bounded ([`EngineConfig::queue_limit`]);
//! [`EngineHandle::submit`] refuses instead of growing it (the server answers 429), and the
//! loop takes from it only when a slot is free. Behind the loop, a sequence whose consumer has
//! not yet taken [`MAX_UNREAD_EVENTS`] of its events is not decoded until it catches up
//! ([`Submit::unread`]): a slow client pauses only its own sequence, its events never pile up
//! without bound, and a client that went away is noticed (a failed write) before its sequence
//! can run on to its `max_tokens`.
//!
//! Tensor and pipeline parallelism: with a model that is one shard of several, this loop runs
//! on global rank 0 and drives the other ranks ([`crate::ranks`]): each model call is first
//! broadcast to them, and the logits come back to this rank; nothing else changes.

pub mod prefill;
mod run;

pub use run::Engine;

use crate::ranks::Driver;
use crate::sampling::SamplingParams;
use anyhow::{bail, Result};
use megatron_gpt::{GptModel, SlotKvCache};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Sender, SyncSender, TrySendError};
use std::sync::Arc;

/// GPT-2's `\n` and `\n\n` ids (the eol rules of SPEC §8.1 are defined on GPT-2 ids).
pub const EOL: i32 = 198;
pub const DOUBLE_EOL: i32 = 628;

/// One sequence to generate: a tokenized prompt and everything that decides its tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct SeqRequest {
    pub prompt: Vec<i32>,
    /// New tokens at most (0 = score the prompt only).
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub seed: u64,
    /// Ids that end the sequence (included in the output, like Megatron's eod).
    pub stop_tokens: Vec<i32>,
    pub stop_on_eol: bool,
    pub stop_on_double_eol: bool,
    /// Forbid `\n` right after this id (Megatron's `prevent_newline_after_colon`).
    pub prevent_newline_after: Option<i32>,
    /// Also report `log p(prompt[i] | prompt[..i])` for `i ≥ 1`.
    pub prompt_logprobs: bool,
    /// Alternatives reported with every token (0 = none).
    pub top_logprobs: usize,
}

impl SeqRequest {
    /// A greedy request of `max_tokens` with no stop token (tests, benchmarks).
    pub fn greedy(prompt: Vec<i32>, max_tokens: usize) -> SeqRequest {
        SeqRequest {
            prompt,
            max_tokens,
            sampling: SamplingParams::greedy(),
            seed: 0,
            stop_tokens: Vec::new(),
            stop_on_eol: false,
            stop_on_double_eol: false,
            prevent_newline_after: None,
            prompt_logprobs: false,
            top_logprobs: 0,
        }
    }
}

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// A stop token or eol rule.
    Stop,
    /// `max_tokens` generated.
    Length,
    /// Cancelled by the submitter (disconnect, stop string).
    Cancelled,
}

/// `(token id, log-probability)` alternatives, most likely first.
pub type TopLogprobs = Vec<(i32, f32)>;

/// What the loop reports for one sequence, in order: `Prompt` (if asked), `Token`s, then
/// exactly one `Done` or `Error`.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Prompt { logprobs: Vec<f32>, top: Vec<TopLogprobs> },
    Token { id: i32, logprob: f32, top: TopLogprobs },
    Done(Finish),
    Error(String),
}

/// Events a sequence may have sent that its consumer has not taken yet; beyond it the loop
/// skips the sequence's decode steps until the consumer catches up.
pub const MAX_UNREAD_EVENTS: usize = 32;

/// A sequence handed to the loop: where its events go and a flag that cancels it.
pub struct Submit {
    pub req: SeqRequest,
    /// Events are sent as `(tag, event)`, so one receiver can serve many sequences.
    pub tag: usize,
    pub events: Sender<(usize, Event)>,
    pub cancel: Arc<AtomicBool>,
    /// Read-ahead bound: the loop adds one per event sent and the consumer subtracts one per
    /// event taken ([`Submit::taken`]). `None`: the consumer drains at once, no bound.
    pub unread: Option<Arc<AtomicUsize>>,
}

impl Submit {
    fn send(&self, ev: Event) -> Result<(), std::sync::mpsc::SendError<(usize, Event)>> {
        if let Some(u) = &self.unread {
            u.fetch_add(1, Ordering::SeqCst);
        }
        self.events.send((self.tag, ev))
    }

    /// Whether the consumer is so far behind that decoding must wait for it.
    fn behind(&self) -> bool {
        self.unread.as_ref().is_some_and(|u| u.load(Ordering::SeqCst) >= MAX_UNREAD_EVENTS)
    }

    /// The consumer's side of [`Submit::unread`]: call once per event received.
    pub fn taken(unread: &AtomicUsize) {
        let _ = unread.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }
}

/// Sizes of the loop.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Sequences decoded together at most (kv cache slots).
    pub max_batch_size: usize,
    /// Bytes the kv cache may use; fewer slots are made if `max_batch_size` would exceed it.
    pub kv_cache_budget: Option<usize>,
    /// Sequences waiting for a slot at most; more are refused.
    pub queue_limit: usize,
    /// Tokens per slot (prompt + generated); 0 = the model's max_position_embeddings.
    pub slot_capacity: usize,
    /// Prompt tokens prefilled per step at most (a longer prompt is fed in chunks, with the
    /// running sequences' decode steps in between); 0 = no limit.
    pub prefill_tokens: usize,
}

/// Default of [`EngineConfig::prefill_tokens`].
pub const PREFILL_TOKENS: usize = 256;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_batch_size: 16,
            kv_cache_budget: None,
            queue_limit: 64,
            slot_capacity: 0,
            prefill_tokens: PREFILL_TOKENS,
        }
    }
}

/// Counters the HTTP side may read (health, logs).
#[derive(Default, Debug)]
pub struct EngineStats {
    pub active: AtomicUsize,
    pub queued: AtomicUsize,
    pub finished: AtomicUsize,
    /// Sequences ended early by their submitter (disconnects, stop strings).
    pub cancelled: AtomicUsize,
    /// Decode steps and the rows they advanced.
    pub steps: AtomicUsize,
    pub decode_rows: AtomicUsize,
    /// Prefill model calls, the prompt tokens they fed and the padding they computed.
    pub prefill_calls: AtomicUsize,
    pub prefill_tokens: AtomicUsize,
    pub padding_tokens: AtomicUsize,
    /// Where the loop's time went (microseconds): prefill and decode model calls, sampling.
    pub prefill_us: AtomicUsize,
    pub decode_us: AtomicUsize,
    pub sample_us: AtomicUsize,
}

impl EngineStats {
    /// The work counters as JSON (`/health`, `megatron bench serve`).
    pub fn profile(&self) -> serde_json::Value {
        let g = |a: &AtomicUsize| a.load(Ordering::Relaxed);
        serde_json::json!({
            "decode_steps": g(&self.steps), "decode_rows": g(&self.decode_rows), "decode_ms": g(&self.decode_us) / 1000,
            "prefill_calls": g(&self.prefill_calls), "prefill_tokens": g(&self.prefill_tokens),
            "padding_tokens": g(&self.padding_tokens), "prefill_ms": g(&self.prefill_us) / 1000,
            "sample_ms": g(&self.sample_us) / 1000,
        })
    }
}

/// Why a submit was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// The queue is full (answer 429 and let the client retry).
    QueueFull,
    /// The loop has stopped (answer 503).
    Stopped,
}

/// The submitting side; cheap to clone, shared by the HTTP threads.
#[derive(Clone)]
pub struct EngineHandle {
    tx: SyncSender<Submit>,
    pub slots: usize,
    pub slot_capacity: usize,
    pub queue_limit: usize,
    pub stats: Arc<EngineStats>,
}

impl EngineHandle {
    /// Queues `s` without blocking.
    pub fn submit(&self, s: Submit) -> Result<(), SubmitError> {
        // Counted before the send so the loop's decrement can never run first.
        self.stats.queued.fetch_add(1, Ordering::SeqCst);
        let r = self.tx.try_send(s);
        if r.is_err() {
            self.stats.queued.fetch_sub(1, Ordering::SeqCst);
        }
        match r {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(SubmitError::QueueFull),
            Err(TrySendError::Disconnected(_)) => Err(SubmitError::Stopped),
        }
    }
}

/// Builds the loop for `model` (whose true vocabulary is `vocab_size`) and its handle: the
/// slot count is `max_batch_size`, lowered to what `kv_cache_budget` holds (an error if not
/// even one slot fits).
pub fn engine(model: &GptModel, vocab_size: usize, cfg: &EngineConfig) -> Result<(EngineHandle, Engine)> {
    let max_pos = model.config().max_position_embeddings;
    let capacity = if cfg.slot_capacity == 0 { max_pos } else { cfg.slot_capacity.min(max_pos) };
    let per_slot = SlotKvCache::bytes_per_slot(model, capacity);
    let mut slots = cfg.max_batch_size.max(1);
    if let Some(budget) = cfg.kv_cache_budget {
        let fit = budget / per_slot.max(1);
        if fit == 0 {
            bail!(
                "--kv-cache-budget {budget} bytes holds no slot: one sequence of {capacity} tokens needs {per_slot} bytes \
                 (raise the budget or lower --max-seq-len)"
            );
        }
        slots = slots.min(fit);
    }
    let cache = model.new_slot_kv_cache(slots, capacity)?;
    let (tx, rx) = sync_channel(cfg.queue_limit.max(1));
    let stats = Arc::new(EngineStats::default());
    let handle =
        EngineHandle { tx, slots, slot_capacity: capacity, queue_limit: cfg.queue_limit.max(1), stats: stats.clone() };
    let eng = Engine {
        rx,
        cache,
        slots: (0..slots).map(|_| None).collect(),
        vocab: vocab_size.min(model.padded_vocab_size()),
        rope: model.config().uses_rope(),
        stats,
        driver: Driver::for_model(model)?,
        prefill_tokens: if cfg.prefill_tokens == 0 { usize::MAX } else { cfg.prefill_tokens },
        admitted: 0,
    };
    Ok((handle, eng))
}

/// The `k` most likely tokens of `logits` with their log-probabilities (ties: lower id first).
pub fn top_logprobs(logits: &[f32], k: usize) -> TopLogprobs {
    if k == 0 || logits.is_empty() {
        return Vec::new();
    }
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let lse = max + logits.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
    let mut ids: Vec<usize> = (0..logits.len()).collect();
    let k = k.min(ids.len());
    ids.select_nth_unstable_by(k - 1, |&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    ids.truncate(k);
    ids.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    ids.into_iter().map(|i| (i as i32, (logits[i] as f64 - lse) as f32)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::log_prob;

    #[test]
    fn top_logprobs_are_sorted_log_softmax() {
        let l = [0.0, 3.0, 1.0, 3.0, -2.0];
        let t = top_logprobs(&l, 3);
        assert_eq!(t.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 3, 2]);
        for &(id, lp) in &t {
            assert!((lp - log_prob(&l, id as usize)).abs() < 1e-6);
        }
        assert!(top_logprobs(&l, 0).is_empty());
        assert_eq!(top_logprobs(&l, 9).len(), 5);
    }
}
