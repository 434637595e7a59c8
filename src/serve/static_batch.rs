//! `megatron serve --batching static`: Megatron's static batching. `PUT /api` requests are
//! validated and tokenized on the HTTP threads and queued as [`Job`]s for ONE model thread,
//! which batches the oldest job with every queued job that shares all its generation settings
//! (and sets no `random_seed`), up to `max_batch_prompts` prompts, and runs them through the
//! [`Generator`] (one shared kv cache offset). Kept as the reference the continuous engine is
//! measured against (`megatron bench serve`).

use super::request::{parse, ApiRequest};
use super::server::HttpContext;
use crate::generate::{GenerationParams, Generator, LoadedModel};
use megatron_core::Tokenizer;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

/// A generation job: tokenized prompts, settings, and where to send the JSON reply.
pub(super) struct Job {
    prompts: Vec<Vec<i32>>,
    params: GenerationParams,
    logprobs: bool,
    batchable: bool,
    reply: Sender<Result<Value, String>>,
}

/// Validates, tokenizes, queues the job and waits for its reply.
pub(super) fn api(body: &[u8], ctx: &HttpContext) -> Result<(Value, Option<String>), String> {
    let r: ApiRequest = parse(body)?;
    let mut prompts = Vec::with_capacity(r.prompts.len());
    for (i, p) in r.prompts.iter().enumerate() {
        let mut ids: Vec<i32> = if r.add_bos { vec![ctx.eod] } else { Vec::new() };
        ids.extend(
            ctx.tokenizer
                .encode(p)
                .map_err(|e| format!("prompt {i} cannot be tokenized: {e}"))?
                .iter()
                .map(|&t| t as i32),
        );
        if ids.is_empty() {
            return Err(format!("prompt {i} has no tokens; use add_BOS"));
        }
        if ids.len() + r.tokens_to_generate > ctx.max_positions {
            return Err(format!(
                "prompt {i} has {} tokens; with tokens_to_generate {} that exceeds the model's context of {} tokens",
                ids.len(),
                r.tokens_to_generate,
                ctx.max_positions
            ));
        }
        prompts.push(ids);
    }
    let n = ctx.counter.fetch_add(1, Ordering::SeqCst);
    let mut stop_tokens = vec![ctx.eod];
    if r.stop_token != ctx.eod as i64 && (0..i32::MAX as i64).contains(&r.stop_token) {
        stop_tokens.push(r.stop_token as i32);
    }
    let params = GenerationParams {
        tokens_to_generate: r.tokens_to_generate,
        sampling: r.sampling,
        stop_tokens,
        stop_on_eol: r.stop_on_eol,
        stop_on_double_eol: r.stop_on_double_eol,
        prevent_newline_after: if r.prevent_newline_after_colon { ctx.colon } else { None },
        seed: r.random_seed.unwrap_or(ctx.opts.seed.wrapping_add(n)),
        use_kv_cache: true,
    };
    let (tx, rx) = channel();
    let job = Job { prompts, params, logprobs: r.logprobs, batchable: r.random_seed.is_none(), reply: tx };
    ctx.jobs
        .lock()
        .map_err(|_| "server is shutting down".to_string())?
        .send(job)
        .map_err(|_| "server is shutting down".to_string())?;
    let value = rx.recv().map_err(|_| "the model thread stopped".to_string())??;
    let log = (ctx.opts.log && !r.no_log)
        .then(|| format!("request {n}: {} prompt(s), {} tokens", r.prompts.len(), r.tokens_to_generate));
    Ok((value, log))
}

/// Jobs that can run in one static batch: everything but the prompts is the same.
fn compatible(a: &Job, b: &Job) -> bool {
    a.batchable
        && b.batchable
        && a.logprobs == b.logprobs
        && GenerationParams { seed: 0, ..a.params.clone() } == GenerationParams { seed: 0, ..b.params.clone() }
}

pub(super) fn model_loop(mut loaded: LoadedModel, rx: Receiver<Job>, max_batch: usize, stop: Arc<AtomicBool>) {
    let tokenizer = loaded.tokenizer.clone();
    let mut pending: Vec<Job> = Vec::new();
    loop {
        if pending.is_empty() {
            match rx.recv_timeout(std::time::Duration::from_millis(100)) {
                Ok(job) => pending.push(job),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) if !stop.load(Ordering::SeqCst) => continue,
                Err(_) => return,
            }
        }
        pending.extend(rx.try_iter());
        // The oldest job and every queued job compatible with it, up to the batch size.
        let first = pending.remove(0);
        let mut batch = vec![first];
        let mut prompts = batch[0].prompts.len();
        let mut i = 0;
        while i < pending.len() {
            if compatible(&batch[0], &pending[i]) && prompts + pending[i].prompts.len() <= max_batch {
                prompts += pending[i].prompts.len();
                batch.push(pending.remove(i));
            } else {
                i += 1;
            }
        }
        run_batch(&mut loaded, tokenizer.as_ref(), batch);
    }
}

fn run_batch(loaded: &mut LoadedModel, tok: &dyn Tokenizer, batch: Vec<Job>) {
    let all: Vec<Vec<i32>> = batch.iter().flat_map(|j| j.prompts.iter().cloned()).collect();
    let mut gen = Generator { model: &mut loaded.model, vocab_size: loaded.vocab_size, pad_id: loaded.eod };
    let result = gen.generate(&all, &batch[0].params, &mut |_, _| true);
    let mut row = 0;
    for job in batch {
        let n = job.prompts.len();
        let reply = match &result {
            Ok(g) => response(tok, &g.tokens[row..row + n], job.logprobs.then(|| &g.logprobs[row..row + n])),
            Err(e) => Err(format!("{e:#}")),
        };
        row += n;
        let _ = job.reply.send(reply); // the HTTP thread may be gone with its client
    }
}

/// Megatron's response: `text`, `segments`, `logprobs` (null unless requested), `tokens`.
fn response(tok: &dyn Tokenizer, tokens: &[Vec<i32>], logprobs: Option<&[Vec<f32>]>) -> Result<Value, String> {
    let mut text = Vec::new();
    let mut segments = Vec::new();
    for row in tokens {
        let ids: Vec<u32> = row.iter().map(|&t| t as u32).collect();
        text.push(tok.decode(&ids).map_err(|e| format!("detokenizing: {e}"))?);
        segments.push(ids.iter().map(|&t| tok.decode(&[t]).unwrap_or_default()).collect::<Vec<_>>());
    }
    Ok(json!({ "text": text, "segments": segments, "logprobs": logprobs, "tokens": tokens }))
}
