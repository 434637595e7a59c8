//! The loop itself: admission into free slots, batched/chunked prefill ([`super::prefill`]),
//! the shared decode step, sampling and retirement. See the parent module for the contract.

use super::prefill::{plan, Pending};
use super::{top_logprobs, EngineStats, Event, Finish, Submit, TopLogprobs, DOUBLE_EOL, EOL};
use crate::ranks::{Driver, Plan};
use crate::sampling::{log_prob, sample};
use anyhow::Result;
use megatron_gpt::{GptModel, SlotCall, SlotKvCache};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An in-flight sequence in its slot.
pub(super) struct Seq {
    pub sub: Submit,
    pub rng: ChaCha8Rng,
    pub top_p: f32,
    /// The last token (fed to the next step) and the one before it (eol rules).
    pub last: i32,
    pub prev: i32,
    pub generated: usize,
    /// Prompt tokens already in the slot; decoding starts once the whole prompt is in.
    pub prefilled: usize,
    /// Admission order: prefill is first come, first served.
    pub order: u64,
    /// `log p(prompt[i] | prompt[..i])` and alternatives, gathered chunk by chunk
    /// (`prompt_logprobs` only).
    pub prompt_lps: Vec<f32>,
    pub prompt_top: Vec<TopLogprobs>,
}

impl Seq {
    fn prefilling(&self) -> bool {
        self.prefilled < self.sub.req.prompt.len()
    }
}

/// The loop's state: the queue's receiving end, the cache and its slots.
pub struct Engine {
    pub(super) rx: Receiver<Submit>,
    pub(super) cache: SlotKvCache,
    pub(super) slots: Vec<Option<Seq>>,
    pub(super) vocab: usize,
    pub(super) rope: bool,
    pub(super) stats: Arc<EngineStats>,
    /// Model-parallel serving: the other ranks follow this loop's model calls.
    pub(super) driver: Option<Driver>,
    /// Prompt tokens prefilled per step at most ([`super::EngineConfig::prefill_tokens`]).
    pub(super) prefill_tokens: usize,
    pub(super) admitted: u64,
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
                    Ok(s) => self.admit(s),
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            while self.slots.iter().any(Option::is_none) {
                match self.rx.try_recv() {
                    Ok(s) => self.admit(s),
                    Err(_) => break,
                }
            }
            self.step(model);
        }
    }

    /// Sequences in slots (prefilling or decoding).
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

    /// Puts `s` into a free slot (its prompt is fed by the next steps' prefill) or answers an
    /// error.
    pub fn admit(&mut self, s: Submit) {
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
        let n = r.prompt.len();
        self.admitted += 1;
        self.slots[slot] = Some(Seq {
            rng: ChaCha8Rng::seed_from_u64(r.seed),
            top_p: r.sampling.top_p,
            last: r.prompt[n - 1],
            prev: if n >= 2 { r.prompt[n - 2] } else { -1 },
            generated: 0,
            prefilled: 0,
            order: self.admitted,
            prompt_lps: Vec::new(),
            prompt_top: Vec::new(),
            sub: s,
        });
        self.stats.active.store(self.active(), Ordering::SeqCst);
    }

    /// One step: retire cancelled sequences, feed this step's prompt chunks, then advance every
    /// decoding sequence by one token.
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
        self.prefill(model);
        self.decode(model);
        self.stats.active.store(self.active(), Ordering::SeqCst);
    }

    /// Feeds up to `prefill_tokens` prompt tokens of the prefilling sequences, several
    /// sequences per model call; a sequence whose prompt is complete samples its first token.
    fn prefill(&mut self, model: &mut GptModel) {
        let pending: Vec<Pending> = (0..self.slots.len())
            .filter_map(|slot| {
                let q = self.slots[slot].as_ref().filter(|q| q.prefilling())?;
                let remaining = q.sub.req.prompt.len() - q.prefilled;
                Some(Pending { slot, offset: q.prefilled, remaining, order: q.order })
            })
            .collect();
        if pending.is_empty() {
            return;
        }
        let vp = model.padded_vocab_size();
        for call in plan(&pending, self.prefill_tokens, self.cache.capacity(), self.rope) {
            let (b, tq) = (call.rows.len(), call.tq);
            let mut tokens = vec![0i32; b * tq];
            let mut pick = Vec::new();
            for (r, c) in call.rows.iter().enumerate() {
                let Some(q) = self.slots[c.slot].as_ref() else { continue };
                let prompt = &q.sub.req.prompt;
                tokens[r * tq..r * tq + c.len].copy_from_slice(&prompt[c.start..c.start + c.len]);
                // Logits of every chunk position for prompt log-probs, else of the last prompt
                // token only (its row gives the first generated token).
                let last = c.start + c.len == prompt.len();
                let first = if q.sub.req.prompt_logprobs {
                    0
                } else if last {
                    c.len - 1
                } else {
                    c.len
                };
                pick.extend((first..c.len).map(|t| r * tq + t));
            }
            let slots: Vec<usize> = call.rows.iter().map(|c| c.slot).collect();
            let valid: Vec<usize> = call.rows.iter().map(|c| c.len).collect();
            let call_in = SlotCall { tokens: &tokens, slots: &slots, valid: &valid, pick: &pick };
            let real: usize = valid.iter().sum();
            self.stats.prefill_calls.fetch_add(1, Ordering::Relaxed);
            self.stats.prefill_tokens.fetch_add(real, Ordering::Relaxed);
            self.stats.padding_tokens.fetch_add(b * tq - real, Ordering::Relaxed);
            let t0 = Instant::now();
            let result = self.forward(model, &call_in);
            self.stats.prefill_us.fetch_add(t0.elapsed().as_micros() as usize, Ordering::Relaxed);
            let logits = match result {
                Ok(l) => l,
                Err(e) => {
                    self.fail(&slots, &e);
                    continue;
                }
            };
            // Picked rows are in row order, each row's positions ascending.
            let mut at = 0;
            for c in &call.rows {
                let Some(mut seq) = self.slots[c.slot].take() else { continue };
                let r = &seq.sub.req;
                let n = r.prompt.len();
                let last = c.start + c.len == n;
                let picked = if r.prompt_logprobs { c.len } else { usize::from(last) };
                let rows = &logits[at * vp..(at + picked) * vp];
                at += picked;
                let vocab = self.vocab;
                let row = |i: usize| &rows[i * vp..i * vp + vocab];
                if r.prompt_logprobs {
                    // Row i is position c.start + i; it scores the prompt token after it.
                    for i in 0..c.len {
                        let p = c.start + i + 1;
                        if p < n {
                            seq.prompt_lps.push(log_prob(row(i), r.prompt[p] as usize));
                            seq.prompt_top.push(top_logprobs(row(i), r.top_logprobs));
                        }
                    }
                }
                seq.prefilled += c.len;
                if !last {
                    self.slots[c.slot] = Some(seq);
                    continue;
                }
                if r.prompt_logprobs {
                    let ev = Event::Prompt {
                        logprobs: std::mem::take(&mut seq.prompt_lps),
                        top: std::mem::take(&mut seq.prompt_top),
                    };
                    let _ = seq.sub.send(ev);
                }
                if r.max_tokens == 0 {
                    let _ = seq.sub.send(Event::Done(Finish::Length));
                    self.retire(c.slot);
                    continue;
                }
                let first_token = row(picked - 1).to_vec();
                self.emit(c.slot, seq, &first_token);
            }
        }
    }

    /// One decode step of every decoding sequence whose consumer keeps up.
    fn decode(&mut self, model: &mut GptModel) {
        let mut rows: Vec<usize> = (0..self.slots.len())
            .filter(|&s| self.slots[s].as_ref().is_some_and(|q| !q.prefilling() && !q.sub.behind()))
            .collect();
        if rows.is_empty() {
            let waiting = self.slots.iter().flatten().any(|q| !q.prefilling());
            if waiting && !self.slots.iter().flatten().any(Seq::prefilling) {
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
            let all: Vec<usize> = (0..group.len()).collect();
            let ones = vec![1; group.len()];
            let call = SlotCall { tokens: &tokens, slots: &group, valid: &ones, pick: &all };
            self.stats.decode_rows.fetch_add(group.len(), Ordering::Relaxed);
            let t0 = Instant::now();
            let result = self.forward(model, &call);
            self.stats.decode_us.fetch_add(t0.elapsed().as_micros() as usize, Ordering::Relaxed);
            match result {
                Ok(logits) => {
                    for (i, &slot) in group.iter().enumerate() {
                        if let Some(seq) = self.slots[slot].take() {
                            self.emit(slot, seq, &logits[i * vp..i * vp + self.vocab]);
                        }
                    }
                }
                Err(e) => self.fail(&group, &e),
            }
        }
    }

    /// Ends the sequences of `slots` with the error of their model call.
    fn fail(&mut self, slots: &[usize], e: &anyhow::Error) {
        for &slot in slots {
            if let Some(seq) = self.slots[slot].take() {
                let _ = seq.sub.send(Event::Error(format!("{e:#}")));
            }
            self.retire(slot);
        }
    }

    /// Samples `seq`'s next token from `raw` (its true-vocabulary logits), reports it, and puts
    /// the sequence back into `slot` unless it is done.
    fn emit(&mut self, slot: usize, seq: Seq, raw: &[f32]) {
        let t0 = Instant::now();
        self.emit_token(slot, seq, raw);
        self.stats.sample_us.fetch_add(t0.elapsed().as_micros() as usize, Ordering::Relaxed);
    }

    fn emit_token(&mut self, slot: usize, mut seq: Seq, raw: &[f32]) {
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
    fn forward(&mut self, model: &mut GptModel, call: &SlotCall) -> Result<Vec<f32>> {
        match self.driver.as_mut() {
            Some(d) => d.forward(model, call, &mut self.cache),
            None => model.forward_slots_with(call, &mut self.cache),
        }
    }

    fn retire(&mut self, slot: usize) {
        self.slots[slot] = None;
        self.cache.free(slot);
        self.stats.finished.fetch_add(1, Ordering::SeqCst);
    }
}
