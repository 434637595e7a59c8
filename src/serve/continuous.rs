//! `megatron serve --batching continuous` (the default): Megatron's `PUT /api` and the OpenAI
//! endpoints (`/v1/...`) as sequences of the continuous-batching engine
//! ([`megatron_serving::engine`]); this file only maps the requests onto it.

use super::request::{parse, ApiRequest};
use megatron_serving::api::{run_seqs, ApiContext};
use megatron_serving::openai::ApiError;
use megatron_serving::{EngineHandle, Event, SeqRequest};
use serde_json::{json, Value};

/// What `PUT /api` needs besides the engine.
pub struct MegatronApi<'a> {
    pub api: &'a ApiContext,
    pub colon: Option<i32>,
    pub default_seed: u64,
}

/// The sequences of one `PUT /api` request (one per prompt, seeds `seed + i`).
pub fn api_seqs(r: &ApiRequest, prompts: Vec<Vec<i32>>, eod: i32, colon: Option<i32>, seed: u64) -> Vec<SeqRequest> {
    let mut stop_tokens = vec![eod];
    if r.stop_token != eod as i64 && (0..i32::MAX as i64).contains(&r.stop_token) {
        stop_tokens.push(r.stop_token as i32);
    }
    prompts
        .into_iter()
        .enumerate()
        .map(|(i, prompt)| SeqRequest {
            prompt,
            max_tokens: r.tokens_to_generate,
            sampling: r.sampling,
            seed: seed.wrapping_add(i as u64),
            stop_tokens: stop_tokens.clone(),
            stop_on_eol: r.stop_on_eol,
            stop_on_double_eol: r.stop_on_double_eol,
            prevent_newline_after: if r.prevent_newline_after_colon { colon } else { None },
            prompt_logprobs: r.logprobs,
            top_logprobs: 0,
        })
        .collect()
}

/// `PUT /api` through the engine: Megatron's response (`text`, `segments`, `logprobs`,
/// `tokens`, every row prompt + generated). `Err((status, message))`; status 0 = client gone.
pub fn megatron_api(
    body: &[u8],
    m: &MegatronApi,
    engine: &EngineHandle,
    alive: &dyn Fn() -> bool,
) -> Result<(Value, String), (u16, String)> {
    let ctx = m.api;
    let r = parse(body).map_err(|e| (400, e))?;
    let mut prompts = Vec::with_capacity(r.prompts.len());
    for (i, p) in r.prompts.iter().enumerate() {
        let mut ids: Vec<i32> = if r.add_bos { vec![ctx.eod] } else { Vec::new() };
        let enc = ctx.tokenizer.encode(p).map_err(|e| (400, format!("prompt {i} cannot be tokenized: {e}")))?;
        ids.extend(enc.iter().map(|&t| t as i32));
        if ids.is_empty() {
            return Err((400, format!("prompt {i} has no tokens; use add_BOS")));
        }
        if ids.len() + r.tokens_to_generate > engine.slot_capacity {
            return Err((
                400,
                format!(
                    "prompt {i} has {} tokens; with tokens_to_generate {} that exceeds the model's context of {} tokens",
                    ids.len(),
                    r.tokens_to_generate,
                    engine.slot_capacity
                ),
            ));
        }
        prompts.push(ids);
    }
    let n = ctx.counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let seed = r.random_seed.unwrap_or(m.default_seed.wrapping_add(n));
    let mut tokens = prompts.clone();
    let mut logprobs: Vec<Vec<f32>> = vec![Vec::new(); prompts.len()];
    let mut error = None;
    let seqs = api_seqs(&r, prompts, ctx.eod, m.colon, seed);
    run_seqs(engine, seqs, alive, &mut |tag, ev, _| {
        match ev {
            Event::Prompt { logprobs: lp, .. } => logprobs[tag] = lp, // comes before the tokens
            Event::Token { id, logprob, .. } => {
                tokens[tag].push(id);
                logprobs[tag].push(logprob);
            }
            Event::Error(e) => error = Some(e),
            Event::Done(_) => {}
        }
        true
    })
    .map_err(|e: ApiError| (e.status, e.message))?;
    if let Some(e) = error {
        return Err((500, e));
    }
    let tok = ctx.tokenizer.as_ref();
    let mut text = Vec::new();
    let mut segments = Vec::new();
    for row in &tokens {
        let ids: Vec<u32> = row.iter().map(|&t| t as u32).collect();
        text.push(tok.decode(&ids).map_err(|e| (500, format!("detokenizing: {e}")))?);
        segments.push(ids.iter().map(|&t| tok.decode(&[t]).unwrap_or_default()).collect::<Vec<_>>());
    }
    let lp = r.logprobs.then_some(&logprobs);
    let log = format!("request {n}: {} prompt(s), {} tokens", r.prompts.len(), r.tokens_to_generate);
    let log = if r.no_log { String::new() } else { log };
    Ok((json!({ "text": text, "segments": segments, "logprobs": lp, "tokens": tokens }), log))
}
