//! The OpenAI endpoints over the continuous-batching engine: `POST /v1/completions`,
//! `POST /v1/chat/completions` (JSON or server-sent events with `"stream": true`) and
//! `GET /v1/models`. Every choice is one engine sequence; a stop sequence or a client that
//! went away cancels sequences, which frees their kv cache slots at the next step.

use crate::engine::{EngineHandle, Event, Finish, SeqRequest, Submit, SubmitError, TopLogprobs};
use crate::openai::{parse_chat, parse_completion, plain_chat_prompt, ApiError, Common, Prompt, RequestLimits};
use crate::text::TextStream;
use megatron_core::Tokenizer;
use serde_json::{json, Value};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

/// A generated token: `(id, log-prob, alternatives)`.
type TokenLp = (i32, f32, TopLogprobs);
/// Log-probs of the prompt tokens after the first, with their alternatives.
type PromptLps = (Vec<f32>, Vec<TopLogprobs>);
/// Called with every `(tag, event)` and the sequences' cancel flags.
pub type OnEvent<'a> = dyn FnMut(usize, Event, &[Arc<AtomicBool>]) -> bool + 'a;

/// Renders chat messages into a prompt (the model's chat template).
pub type ChatRenderer = Box<dyn Fn(&[Value]) -> Result<String, String> + Send + Sync>;

/// What the endpoints share.
pub struct ApiContext {
    pub model_name: String,
    pub tokenizer: Arc<dyn Tokenizer>,
    pub vocab_size: usize,
    pub eod: i32,
    pub engine: EngineHandle,
    pub limits: RequestLimits,
    /// `None`: chats are rendered as `role: content` lines ([`plain_chat_prompt`]).
    pub chat_template: Option<ChatRenderer>,
    pub seed: u64,
    pub counter: AtomicU64,
    pub created: u64,
}

/// Submits `reqs` (tagged by index) and hands every event to `on` until all sequences have
/// ended. `alive` is polled while waiting: a client that went away cancels everything.
/// `on` returns false to cancel everything (a failed write).
pub fn run_seqs(
    engine: &EngineHandle,
    reqs: Vec<SeqRequest>,
    alive: &dyn Fn() -> bool,
    on: &mut OnEvent,
) -> Result<(), ApiError> {
    let (tx, rx) = channel();
    let n = reqs.len();
    let cancels: Vec<Arc<AtomicBool>> = (0..n).map(|_| Arc::new(AtomicBool::new(false))).collect();
    let unread: Vec<Arc<AtomicUsize>> = (0..n).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    let cancel_all = |c: &[Arc<AtomicBool>]| c.iter().for_each(|f| f.store(true, Ordering::SeqCst));
    for (tag, req) in reqs.into_iter().enumerate() {
        let s =
            Submit { req, tag, events: tx.clone(), cancel: cancels[tag].clone(), unread: Some(unread[tag].clone()) };
        if let Err(e) = engine.submit(s) {
            cancel_all(&cancels);
            return Err(match e {
                SubmitError::QueueFull => ApiError::new(
                    429,
                    format!("the server is busy: {} sequences are waiting for a slot; retry later", engine.queue_limit),
                )
                .code("queue_full"),
                SubmitError::Stopped => ApiError::new(503, "the generation engine has stopped").code("engine_stopped"),
            });
        }
    }
    drop(tx);
    let mut open = n;
    while open > 0 {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok((tag, ev)) => {
                Submit::taken(&unread[tag]);
                if matches!(ev, Event::Done(_) | Event::Error(_)) {
                    open -= 1;
                }
                if !on(tag, ev, &cancels) {
                    cancel_all(&cancels);
                    return Err(ApiError::new(0, "client went away"));
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                if !alive() {
                    cancel_all(&cancels);
                    return Err(ApiError::new(0, "client went away"));
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(ApiError::new(503, "the generation engine stopped mid-request").code("engine_stopped"))
            }
        }
    }
    Ok(())
}

/// `GET /v1/models`.
pub fn models(ctx: &ApiContext) -> Value {
    json!({ "object": "list", "data": [{ "id": ctx.model_name, "object": "model", "created": ctx.created,
        "owned_by": "megatron-rs", "max_model_len": ctx.engine.slot_capacity }] })
}

/// One choice being assembled.
struct Choice {
    text: TextStream,
    /// Echoed prompt text, not sent yet.
    prefix: String,
    /// Ids of the echoed prompt (completions with echo + logprobs).
    prompt: Vec<i32>,
    prompt_lps: Option<PromptLps>,
    /// `(id, logprob, alternatives)` of every generated token kept (not after a stop).
    tokens: Vec<TokenLp>,
    /// Log-prob entries not streamed yet.
    unsent: usize,
    finish: Option<&'static str>,
    error: Option<String>,
    generated: usize,
    done: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Completion,
    Chat,
}

/// A request in flight: its choices and, when streaming, the connection.
struct Session<'a> {
    kind: Kind,
    c: &'a Common,
    ctx: &'a ApiContext,
    choices: Vec<Choice>,
    w: &'a mut dyn Write,
    started: bool,
    head: Value,
}

impl Session<'_> {
    fn on_event(&mut self, tag: usize, ev: Event, cancels: &[Arc<AtomicBool>]) -> bool {
        let tok = self.ctx.tokenizer.clone();
        let ch = &mut self.choices[tag];
        let mut piece = String::new();
        match ev {
            Event::Prompt { logprobs, top } => {
                ch.prompt_lps = Some((logprobs, top));
                return true;
            }
            Event::Token { id, logprob, top } => {
                ch.generated += 1;
                if ch.finish.is_some() || id == self.ctx.eod {
                    return true; // after a stop sequence, or the end-of-text token (not shown)
                }
                piece = ch.text.push(tok.as_ref(), id);
                ch.tokens.push((id, logprob, top));
                if ch.text.stopped {
                    ch.finish = Some("stop");
                    cancels[tag].store(true, Ordering::SeqCst); // frees the slot at the next step
                }
            }
            Event::Done(f) => {
                piece = ch.text.finish();
                ch.done = true;
                ch.finish.get_or_insert(if f == Finish::Length { "length" } else { "stop" });
            }
            Event::Error(e) => {
                ch.done = true;
                ch.error = Some(e);
            }
        }
        if !self.c.stream {
            return true;
        }
        self.stream_chunk(tag, piece)
    }

    fn sse(&mut self, v: &Value) -> bool {
        write!(self.w, "data: {v}\n\n").and_then(|_| self.w.flush()).is_ok()
    }

    fn chunk(&self, choices: Value) -> Value {
        let mut h = self.head.clone();
        h["choices"] = choices;
        h
    }

    fn start_stream(&mut self) -> bool {
        self.started = true;
        let hdr = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n";
        if self.w.write_all(hdr.as_bytes()).is_err() {
            return false;
        }
        if self.kind == Kind::Chat {
            for i in 0..self.choices.len() {
                let d = json!([{ "index": i, "delta": { "role": "assistant", "content": "" }, "logprobs": null, "finish_reason": null }]);
                if !self.sse(&self.chunk(d)) {
                    return false;
                }
            }
        }
        true
    }

    fn stream_chunk(&mut self, tag: usize, piece: String) -> bool {
        if !self.started && !self.start_stream() {
            return false;
        }
        if let Some(e) = self.choices[tag].error.take() {
            let err = ApiError::new(500, format!("choice {tag}: {e}")).body();
            return self.sse(&err);
        }
        let want_lp = self.c.logprobs.is_some();
        let ch = &mut self.choices[tag];
        let text = std::mem::take(&mut ch.prefix) + &piece;
        let new_tokens = &ch.tokens[ch.unsent..];
        if text.is_empty() && !ch.done && (!want_lp || new_tokens.is_empty()) {
            return true; // held-back text, nothing to say yet
        }
        let finish = if ch.done { ch.finish } else { None };
        let tok = self.ctx.tokenizer.clone();
        let v = match self.kind {
            Kind::Completion => {
                let lps = want_lp.then(|| {
                    let prompt = ch.prompt_lps.take().map(|p| (std::mem::take(&mut ch.prompt), p));
                    completion_logprobs(tok.as_ref(), prompt, new_tokens)
                });
                json!([{ "index": tag, "text": text, "logprobs": lps, "finish_reason": finish }])
            }
            Kind::Chat => {
                let delta = if text.is_empty() { json!({}) } else { json!({ "content": text }) };
                let lps = want_lp.then(|| json!({ "content": chat_logprobs(tok.as_ref(), new_tokens) }));
                json!([{ "index": tag, "delta": delta, "logprobs": lps, "finish_reason": finish }])
            }
        };
        ch.unsent = ch.tokens.len();
        self.sse(&self.chunk(v))
    }

    fn usage(&self, prompt_tokens: usize) -> Value {
        let g: usize = self.choices.iter().map(|c| c.generated).sum();
        json!({ "prompt_tokens": prompt_tokens, "completion_tokens": g, "total_tokens": prompt_tokens + g })
    }

    /// The whole non-streamed answer.
    fn response(&mut self, prompt_tokens: usize) -> Result<Value, ApiError> {
        if let Some((i, e)) = self.choices.iter().enumerate().find_map(|(i, c)| c.error.as_ref().map(|e| (i, e))) {
            return Err(ApiError::new(500, format!("choice {i}: {e}")));
        }
        let tok = self.ctx.tokenizer.clone();
        let want_lp = self.c.logprobs.is_some();
        let mut out = Vec::new();
        for (i, ch) in self.choices.iter_mut().enumerate() {
            let text = ch.prefix.clone() + ch.text.text();
            out.push(match self.kind {
                Kind::Completion => {
                    let lps = want_lp.then(|| {
                        let prompt = ch.prompt_lps.take().map(|p| (std::mem::take(&mut ch.prompt), p));
                        completion_logprobs(tok.as_ref(), prompt, &ch.tokens)
                    });
                    json!({ "index": i, "text": text, "logprobs": lps, "finish_reason": ch.finish })
                }
                Kind::Chat => json!({ "index": i, "message": { "role": "assistant", "content": text },
                    "logprobs": want_lp.then(|| json!({ "content": chat_logprobs(tok.as_ref(), &ch.tokens) })),
                    "finish_reason": ch.finish }),
            });
        }
        let mut v = self.chunk(Value::Array(out));
        v["usage"] = self.usage(prompt_tokens);
        Ok(v)
    }
}

fn piece(tok: &dyn Tokenizer, id: i32) -> String {
    tok.decode(&[id.max(0) as u32]).unwrap_or_default()
}

/// Completions' `logprobs`: `tokens`, `token_logprobs`, `top_logprobs`, `text_offset`; the
/// echoed prompt (if any) first, its first token without a log-prob.
fn completion_logprobs(tok: &dyn Tokenizer, prompt: Option<(Vec<i32>, PromptLps)>, gen: &[TokenLp]) -> Value {
    let (mut tokens, mut lps, mut tops, mut offsets) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut offset = 0usize;
    let top_map =
        |t: &[(i32, f32)]| -> Value { Value::Object(t.iter().map(|&(id, lp)| (piece(tok, id), json!(lp))).collect()) };
    let mut add = |id: i32, lp: Option<f32>, top: Option<&[(i32, f32)]>| {
        let p = piece(tok, id);
        offsets.push(offset);
        offset += p.len();
        tokens.push(p);
        lps.push(lp.map_or(Value::Null, |x| json!(x)));
        tops.push(top.map_or(Value::Null, top_map));
    };
    if let Some((ids, (plps, ptop))) = prompt {
        for (i, &id) in ids.iter().enumerate() {
            let j = i.checked_sub(1);
            add(id, j.and_then(|j| plps.get(j).copied()), j.and_then(|j| ptop.get(j)).map(Vec::as_slice));
        }
    }
    for (id, lp, top) in gen {
        add(*id, Some(*lp), Some(top));
    }
    json!({ "tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets })
}

/// Chat's `logprobs.content`: `{token, logprob, bytes, top_logprobs}` per token.
fn chat_logprobs(tok: &dyn Tokenizer, gen: &[TokenLp]) -> Value {
    let entry = |id: i32, lp: f32| {
        let p = piece(tok, id);
        json!({ "token": p, "logprob": lp, "bytes": p.as_bytes() })
    };
    Value::Array(
        gen.iter()
            .map(|(id, lp, top)| {
                let mut e = entry(*id, *lp);
                e["top_logprobs"] = Value::Array(top.iter().map(|&(t, l)| entry(t, l)).collect());
                e
            })
            .collect(),
    )
}

/// Token ids of every prompt, checked against the vocabulary and the context length.
fn tokenize(prompts: &[Prompt], ctx: &ApiContext, c: &Common) -> Result<Vec<Vec<i32>>, ApiError> {
    let mut out = Vec::with_capacity(prompts.len());
    for (i, p) in prompts.iter().enumerate() {
        let ids: Vec<i32> = match p {
            Prompt::Text(t) => ctx
                .tokenizer
                .encode(t)
                .map_err(|e| ApiError::new(422, format!("prompt {i} cannot be tokenized: {e:#}")).code("tokenization"))?
                .into_iter()
                .map(|t| t as i32)
                .collect(),
            Prompt::Ids(ids) => {
                if let Some(&bad) = ids.iter().find(|&&t| t as usize >= ctx.vocab_size) {
                    return Err(ApiError::param(
                        "prompt",
                        format!("prompt {i}: token id {bad} is outside the vocabulary [0, {})", ctx.vocab_size),
                    ));
                }
                ids.clone()
            }
        };
        let ids = if ids.is_empty() { vec![ctx.eod] } else { ids }; // an empty prompt starts at end-of-text
        let cap = ctx.engine.slot_capacity;
        if ids.len() + c.max_tokens > cap {
            return Err(ApiError::param(
                "max_tokens",
                format!(
                    "this model's context is {cap} tokens; prompt {i} has {} tokens and max_tokens is {}: shorten the \
                     prompt or lower max_tokens",
                    ids.len(),
                    c.max_tokens
                ),
            )
            .code("context_length_exceeded"));
        }
        out.push(ids);
    }
    Ok(out)
}

/// `POST /v1/completions` or `/v1/chat/completions`: answers on `w` (JSON or SSE) and returns
/// a log line. An `Err` is answered by the caller (nothing has been written then; status 0 =
/// the client went away, nobody to answer).
pub fn complete(
    path: &str,
    body: &[u8],
    w: &mut dyn Write,
    alive: &dyn Fn() -> bool,
    ctx: &ApiContext,
) -> Result<String, ApiError> {
    let kind = if path.ends_with("/chat/completions") { Kind::Chat } else { Kind::Completion };
    let (prompts, echo, c) = match kind {
        Kind::Completion => {
            let r = parse_completion(body, &ctx.limits)?;
            (r.prompts, r.echo, r.common)
        }
        Kind::Chat => {
            let r = parse_chat(body, &ctx.limits)?;
            let text = match &ctx.chat_template {
                Some(render) => render(&r.messages)
                    .map_err(|e| ApiError::new(422, format!("the chat template failed: {e}")).code("chat_template"))?,
                None => plain_chat_prompt(&r.messages),
            };
            (vec![Prompt::Text(text)], false, r.common)
        }
    };
    if let Some(m) = c.model.as_deref().filter(|&m| m != ctx.model_name) {
        return Err(ApiError {
            param: Some("model".into()),
            ..ApiError::new(
                404,
                format!("the model `{m:.100}` does not exist; this server serves `{}`", ctx.model_name),
            )
            .code("model_not_found")
        });
    }
    let ids = tokenize(&prompts, ctx, &c)?;
    let id = ctx.counter.fetch_add(1, Ordering::SeqCst);
    let base_seed = c.seed.unwrap_or_else(|| ctx.seed.wrapping_add(id.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    let mut reqs = Vec::new();
    let mut choices = Vec::new();
    for p in &ids {
        for _ in 0..c.n {
            reqs.push(SeqRequest {
                prompt: p.clone(),
                max_tokens: c.max_tokens,
                sampling: c.sampling,
                seed: base_seed.wrapping_add(reqs.len() as u64),
                stop_tokens: vec![ctx.eod],
                stop_on_eol: false,
                stop_on_double_eol: false,
                prevent_newline_after: None,
                prompt_logprobs: echo && c.logprobs.is_some(),
                top_logprobs: c.logprobs.unwrap_or(0),
            });
            let text = ctx.tokenizer.decode(&p.iter().map(|&t| t as u32).collect::<Vec<_>>()).unwrap_or_default();
            choices.push(Choice {
                text: TextStream::new(&c.stop),
                prefix: if echo { text } else { String::new() },
                prompt: p.clone(),
                prompt_lps: None,
                tokens: Vec::new(),
                unsent: 0,
                finish: None,
                error: None,
                generated: 0,
                done: false,
            });
        }
    }
    let object = match (kind, c.stream) {
        (Kind::Chat, true) => "chat.completion.chunk",
        (Kind::Chat, false) => "chat.completion",
        (Kind::Completion, _) => "text_completion",
    };
    let rid = format!("{}-{id}", if kind == Kind::Chat { "chatcmpl" } else { "cmpl" });
    let head = json!({ "id": rid, "object": object, "created": ctx.created, "model": ctx.model_name, "choices": [] });
    let prompt_tokens: usize = ids.iter().map(Vec::len).sum();
    let n_seqs = reqs.len();
    let mut s = Session { kind, c: &c, ctx, choices, w, started: false, head };
    let run = run_seqs(&ctx.engine, reqs, alive, &mut |tag, ev, cancels| s.on_event(tag, ev, cancels));
    let log = format!("{rid}: {} prompt(s) x n={}, {prompt_tokens} prompt tokens", ids.len(), c.n);
    if c.stream {
        if let Err(e) = run {
            if !s.started {
                return Err(e);
            }
            if e.status != 0 {
                let _ = s.sse(&e.body());
            }
            return Ok(log);
        }
        if c.include_usage {
            let mut u = s.chunk(json!([]));
            u["usage"] = s.usage(prompt_tokens);
            s.sse(&u);
        }
        let _ = write!(s.w, "data: [DONE]\n\n").and_then(|_| s.w.flush());
        return Ok(format!("{log}, {n_seqs} streamed"));
    }
    run?;
    let v = s.response(prompt_tokens)?;
    crate::http::write_json(s.w, 200, &v.to_string()).map_err(|e| ApiError::new(0, format!("writing: {e}")))?;
    Ok(format!("{log}, {} completion tokens", v["usage"]["completion_tokens"]))
}
