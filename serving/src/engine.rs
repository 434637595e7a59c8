//! Continuous (in-flight) batching: ONE decode loop on the model thread over a slotted kv cache
//! ([`megatron_gpt::SlotKvCache`]), one slot per in-flight sequence.
//!
//! Between two decode steps the loop retires sequences that finished (a stop token, their
//! `max_tokens`) or were cancelled (a client that went away, a stop string found by the HTTP
//! side), and admits queued sequences into the freed slots: each is prefilled alone into its
//! slot and samples its first token, then joins the shared decode step, where every active
//! sequence advances by one token at its own position. Every sequence keeps its own sampling
//! settings and its own seeded generator, so its tokens depend only on its prompt, settings
//! and seed — not on which sequences share its steps (the CPU kernels compute each row in a
//! fixed order independent of the batch; `tests/serve_continuous.rs` checks it).
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

use crate::ranks::{Driver, Plan};
use crate::sampling::{log_prob, sample, SamplingParams};
use anyhow::{bail, Result};
use megatron_gpt::{GptModel, SlotKvCache};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, Sender, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

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
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig { max_batch_size: 16, kv_cache_budget: None, queue_limit: 64, slot_capacity: 0 }
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
    pub steps: AtomicUsize,
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

/// An in-flight sequence in its slot.
struct Seq {
    sub: Submit,
    rng: ChaCha8Rng,
    top_p: f32,
    /// The last token (fed to the next step) and the one before it (eol rules).
    last: i32,
    prev: i32,
    generated: usize,
}

/// The loop's state: the queue's receiving end, the cache and its slots.
pub struct Engine {
    rx: Receiver<Submit>,
    cache: SlotKvCache,
    slots: Vec<Option<Seq>>,
    vocab: usize,
    rope: bool,
    stats: Arc<EngineStats>,
    /// Model-parallel serving: the other ranks follow this loop's model calls.
    driver: Option<Driver>,
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
    let vocab = vocab_size.min(model.padded_vocab_size());
    let rope = model.config().uses_rope();
    let driver = Driver::for_model(model)?;
    let slots = (0..slots).map(|_| None).collect();
    Ok((handle, Engine { rx, cache, slots, vocab, rope, stats, driver }))
}

impl Engine {
    /// Runs until `stop` is set or every handle is dropped (and nothing is in flight).
    /// With a model-parallel model the followers are told to stop when it returns.
    pub fn run(mut self, model: &mut GptModel, stop: &AtomicBool) {
        if let Some(d) = self.driver.as_mut() {
            let init = Plan::Init { slots: self.cache.slots(), capacity: self.cache.capacity() };
            if let Err(e) = d.send(model, &init) {
                eprintln!("serving engine: the model-parallel ranks did not start: {e:#}");
                return;
            }
        }
        self.run_loop(model, stop);
        if let Some(d) = self.driver.as_mut() {
            d.stop(model);
        }
    }

    fn run_loop(&mut self, model: &mut GptModel, stop: &AtomicBool) {
        loop {
            if stop.load(Ordering::SeqCst) {
                self.cancel_all("the server is shutting down");
                return;
            }
            if let Some(d) = self.driver.as_mut() {
                if let Err(e) = d.heartbeat(model) {
                    eprintln!("serving engine: a model-parallel rank failed: {e:#}");
                    self.cancel_all("a model-parallel rank failed");
                    return;
                }
            }
            if self.active() == 0 {
                match self.rx.recv_timeout(Duration::from_millis(50)) {
                    Ok(s) => self.admit(model, s),
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            while self.slots.iter().any(Option::is_none) {
                match self.rx.try_recv() {
                    Ok(s) => self.admit(model, s),
                    Err(_) => break,
                }
            }
            self.step(model);
        }
    }

    /// Sequences in slots.
    pub fn active(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    fn cancel_all(&mut self, why: &str) {
        for slot in 0..self.slots.len() {
            if let Some(seq) = self.slots[slot].take() {
                let _ = seq.sub.send(Event::Error(why.to_string()));
                self.cache.free(slot);
            }
        }
        self.stats.active.store(0, Ordering::SeqCst);
    }

    /// Prefills `s` into a free slot and samples its first token (or answers an error).
    pub fn admit(&mut self, model: &mut GptModel, s: Submit) {
        self.stats.queued.fetch_sub(1, Ordering::SeqCst);
        if s.cancel.load(Ordering::SeqCst) {
            let _ = s.send(Event::Done(Finish::Cancelled));
            return;
        }
        let Some(slot) = self.slots.iter().position(Option::is_none) else {
            let _ = s.send(Event::Error("no free kv cache slot (engine bug)".into()));
            return;
        };
        let r = &s.req;
        let need = r.prompt.len() + r.max_tokens;
        if r.prompt.is_empty() || need > self.cache.capacity() {
            let msg = format!(
                "prompt of {} tokens + max_tokens {} = {need} exceeds the {} tokens of a kv cache slot",
                r.prompt.len(),
                r.max_tokens,
                self.cache.capacity()
            );
            let _ = s.send(Event::Error(if r.prompt.is_empty() { "empty prompt".into() } else { msg }));
            return;
        }
        self.cache.free(slot);
        let logits = match self.forward(model, &r.prompt, &[slot]) {
            Ok(l) => l,
            Err(e) => {
                self.cache.free(slot);
                let _ = s.send(Event::Error(format!("{e:#}")));
                return;
            }
        };
        let vp = model.padded_vocab_size();
        let n = r.prompt.len();
        if r.prompt_logprobs {
            let row = |p: usize| &logits[p * vp..p * vp + self.vocab];
            let lps = (1..n).map(|p| log_prob(row(p - 1), r.prompt[p] as usize)).collect();
            let top = (1..n).map(|p| top_logprobs(row(p - 1), r.top_logprobs)).collect();
            let _ = s.send(Event::Prompt { logprobs: lps, top });
        }
        let seq = Seq {
            rng: ChaCha8Rng::seed_from_u64(r.seed),
            top_p: r.sampling.top_p,
            last: r.prompt[n - 1],
            prev: if n >= 2 { r.prompt[n - 2] } else { -1 },
            generated: 0,
            sub: s,
        };
        if seq.sub.req.max_tokens == 0 {
            self.cache.free(slot);
            let _ = seq.sub.send(Event::Done(Finish::Length));
            self.stats.finished.fetch_add(1, Ordering::SeqCst);
            return;
        }
        let last_row = logits[(n - 1) * vp..(n - 1) * vp + self.vocab].to_vec();
        self.emit(slot, seq, &last_row);
        self.stats.active.store(self.active(), Ordering::SeqCst);
    }

    /// One decode step of every active sequence (cancelled ones are retired first).
    pub fn step(&mut self, model: &mut GptModel) {
        for slot in 0..self.slots.len() {
            if self.slots[slot].as_ref().is_some_and(|q| q.sub.cancel.load(Ordering::SeqCst)) {
                if let Some(seq) = self.slots[slot].take() {
                    let _ = seq.sub.send(Event::Done(Finish::Cancelled));
                }
                self.stats.cancelled.fetch_add(1, Ordering::SeqCst);
                self.retire(slot);
            }
        }
        let mut rows: Vec<usize> =
            (0..self.slots.len()).filter(|&s| self.slots[s].as_ref().is_some_and(|q| !q.sub.behind())).collect();
        if rows.is_empty() {
            // The last sequences were cancelled: /health must show the freed slots now (the
            // idle loop does not step again until a request arrives).
            self.stats.active.store(self.active(), Ordering::SeqCst);
            if self.active() > 0 {
                // Every sequence waits for its consumer: do not spin.
                std::thread::sleep(Duration::from_millis(1));
            }
            return;
        }
        self.stats.steps.fetch_add(1, Ordering::SeqCst);
        // Rotary positions are per call: group the rows by cached length (one group otherwise).
        let mut groups: Vec<Vec<usize>> = Vec::new();
        if self.rope {
            rows.sort_by_key(|&s| (self.cache.len(s), s));
            for s in rows {
                match groups.last_mut() {
                    Some(g) if self.cache.len(g[0]) == self.cache.len(s) => g.push(s),
                    _ => groups.push(vec![s]),
                }
            }
        } else {
            groups.push(rows);
        }
        let vp = model.padded_vocab_size();
        for group in groups {
            let tokens: Vec<i32> = group.iter().map(|&s| self.slots[s].as_ref().map_or(0, |q| q.last)).collect();
            match self.forward(model, &tokens, &group) {
                Ok(logits) => {
                    for (i, &slot) in group.iter().enumerate() {
                        if let Some(seq) = self.slots[slot].take() {
                            self.emit(slot, seq, &logits[i * vp..i * vp + self.vocab]);
                        }
                    }
                }
                Err(e) => {
                    for &slot in &group {
                        if let Some(seq) = self.slots[slot].take() {
                            let _ = seq.sub.send(Event::Error(format!("{e:#}")));
                        }
                        self.retire(slot);
                    }
                }
            }
        }
        self.stats.active.store(self.active(), Ordering::SeqCst);
    }

    /// Samples `seq`'s next token from `raw` (its true-vocabulary logits), reports it, and puts
    /// the sequence back into `slot` unless it is done.
    fn emit(&mut self, slot: usize, mut seq: Seq, raw: &[f32]) {
        let r = &seq.sub.req;
        let forbid = r.prevent_newline_after.is_some_and(|c| seq.last == c) && (EOL as usize) < raw.len();
        let token = if forbid {
            let mut l = raw.to_vec();
            l[EOL as usize] = -1e10;
            sample(&l, &r.sampling, seq.top_p, &mut seq.rng)
        } else {
            sample(raw, &r.sampling, seq.top_p, &mut seq.rng)
        } as i32;
        seq.top_p = r.sampling.decayed_top_p(seq.top_p);
        seq.generated += 1;
        let ev =
            Event::Token { id: token, logprob: log_prob(raw, token as usize), top: top_logprobs(raw, r.top_logprobs) };
        let stop = r.stop_tokens.contains(&token)
            || (r.stop_on_double_eol && (token == DOUBLE_EOL || (token == EOL && seq.last == EOL)))
            || (r.stop_on_eol && !r.stop_on_double_eol && (token == EOL || token == DOUBLE_EOL));
        let length = seq.generated >= r.max_tokens;
        if seq.sub.send(ev).is_err() {
            self.stats.cancelled.fetch_add(1, Ordering::SeqCst);
            self.retire(slot); // nobody listens any more
            return;
        }
        if stop || length {
            let _ = seq.sub.send(Event::Done(if stop { Finish::Stop } else { Finish::Length }));
            self.retire(slot);
            return;
        }
        seq.prev = seq.last;
        seq.last = token;
        self.slots[slot] = Some(seq);
    }

    /// One model call: on this rank alone, or broadcast to the followers first.
    fn forward(&mut self, model: &mut GptModel, tokens: &[i32], slots: &[usize]) -> Result<Vec<f32>> {
        match self.driver.as_mut() {
            Some(d) => d.forward(model, tokens, slots, &mut self.cache),
            None => model.forward_slots(tokens, slots, &mut self.cache),
        }
    }

    fn retire(&mut self, slot: usize) {
        self.slots[slot] = None;
        self.cache.free(slot);
        self.stats.finished.fetch_add(1, Ordering::SeqCst);
    }
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
