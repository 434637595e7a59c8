//! Batched and chunked prefill of the continuous engine: requests of mixed prompt lengths and
//! settings, all admitted at once and prefilled several per model call (rows padded), with long
//! prompts split into chunks over several steps, give exactly the events — prompt log-probs,
//! tokens, their log-probs and alternatives — that each request gives alone with its whole
//! prompt in one call; with learned and with rotary positions. And a long prompt fed in chunks
//! lets the running sequences decode in between.

use megatron::generate::SamplingParams;
use megatron_core::{Backend, ParallelContext};
use megatron_gpt::{GptConfig, GptModel};
use megatron_serving::engine::{engine, EngineConfig, Event, SeqRequest, Submit};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::Duration;

const VOCAB: usize = 64;

fn config(rope: bool) -> GptConfig {
    let mut c = GptConfig::new(2, 32, 4, 64, VOCAB);
    c.hidden_dropout = 0.0;
    c.attention_dropout = 0.0;
    c.init_method_std = 0.2; // peaked logits: sampled tokens depend on every logit bit
    c.make_vocab_size_divisible_by = 16;
    if rope {
        c.position_embedding_type = "rope".into();
        c.num_query_groups = Some(2);
        c.normalization = megatron_transformer::NormKind::RMSNorm;
        c.swiglu = true;
        c.add_bias_linear = false;
        c.untie_embeddings_and_output_weights = true;
    }
    c
}

fn model(rope: bool) -> GptModel {
    let backend: Arc<dyn Backend> = Arc::new(megatron_cpu::CpuBackend::new());
    GptModel::new(config(rope), backend, ParallelContext::single()).unwrap()
}

/// Mixed prompt lengths (1 to 33 tokens) and settings: greedy, sampled with seeds, top-k, prompt
/// log-probs with alternatives, a scoring-only request.
fn requests() -> Vec<SeqRequest> {
    let prompt = |n: usize, k: i32| (0..n as i32).map(|i| (i * 7 + k) % 60 + 1).collect::<Vec<_>>();
    let sampled = |n, k, max, t, top_k, seed| SeqRequest {
        sampling: SamplingParams { temperature: t, top_k, ..SamplingParams::default() },
        seed,
        ..SeqRequest::greedy(prompt(n, k), max)
    };
    vec![
        SeqRequest::greedy(prompt(1, 3), 9),
        sampled(7, 5, 12, 1.2, 0, 42),
        SeqRequest { prompt_logprobs: true, top_logprobs: 2, ..SeqRequest::greedy(prompt(20, 1), 6) },
        sampled(33, 2, 8, 0.8, 5, 7),
        SeqRequest { prompt_logprobs: true, top_logprobs: 3, ..sampled(12, 9, 10, 1.0, 0, 3) },
        SeqRequest { prompt_logprobs: true, ..SeqRequest::greedy(prompt(5, 4), 0) },
        SeqRequest::greedy(prompt(19, 8), 14),
    ]
}

/// Submits every request before the loop starts (so they are admitted together), runs the
/// engine and returns each request's events, in submission order.
fn run(rope: bool, reqs: &[SeqRequest], slots: usize, prefill_tokens: usize) -> Vec<Vec<Event>> {
    let mut m = model(rope);
    let cfg = EngineConfig { max_batch_size: slots, prefill_tokens, ..EngineConfig::default() };
    let (handle, eng) = engine(&m, VOCAB, &cfg).unwrap();
    let (tx, rx) = channel();
    for (tag, req) in reqs.iter().enumerate() {
        let cancel = Arc::new(AtomicBool::new(false));
        handle.submit(Submit { req: req.clone(), tag, events: tx.clone(), cancel, unread: None }).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let t = std::thread::spawn(move || eng.run(&mut m, &s2));
    let out = collect(&rx, reqs.len());
    stop.store(true, Ordering::SeqCst);
    t.join().unwrap();
    out
}

fn collect(rx: &Receiver<(usize, Event)>, n: usize) -> Vec<Vec<Event>> {
    let mut out = vec![Vec::new(); n];
    let mut done = 0;
    while done < n {
        let (tag, ev) = rx.recv_timeout(Duration::from_secs(60)).expect("the engine stalled");
        assert!(!matches!(ev, Event::Error(_)), "request {tag}: {ev:?}");
        done += usize::from(matches!(ev, Event::Done(_)));
        out[tag].push(ev);
    }
    out
}

/// Log-probabilities may differ in the last bits with the batch size of a call (the GEMM's
/// blocking depends on its row count; decode steps had this before batched prefill too).
const LOGPROB_TOL: f32 = 1e-5;

/// Identical tokens, finish reasons and alternative ids; log-probs within [`LOGPROB_TOL`].
fn same(alone: &[Event], together: &[Event], what: &str) {
    let close = |a: f32, b: f32| (a - b).abs() <= LOGPROB_TOL;
    let top = |a: &[(i32, f32)], b: &[(i32, f32)]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.0 == y.0 && close(x.1, y.1))
    };
    assert_eq!(alone.len(), together.len(), "{what}: {together:?} vs alone {alone:?}");
    for (a, b) in alone.iter().zip(together) {
        let ok = match (a, b) {
            (Event::Prompt { logprobs: la, top: ta }, Event::Prompt { logprobs: lb, top: tb }) => {
                la.len() == lb.len()
                    && la.iter().zip(lb).all(|(&x, &y)| close(x, y))
                    && ta.len() == tb.len()
                    && ta.iter().zip(tb).all(|(x, y)| top(x, y))
            }
            (Event::Token { id: ia, logprob: la, top: ta }, Event::Token { id: ib, logprob: lb, top: tb }) => {
                ia == ib && close(*la, *lb) && top(ta, tb)
            }
            (a, b) => a == b,
        };
        assert!(ok, "{what}: {b:?} differs from alone: {a:?}");
    }
}

fn check(rope: bool) {
    let reqs = requests();
    // One at a time: each request alone, its whole prompt in one call.
    let alone: Vec<Vec<Event>> = reqs.iter().map(|r| run(rope, std::slice::from_ref(r), 1, 0).remove(0)).collect();
    for (i, ev) in alone.iter().enumerate() {
        let tokens = ev.iter().filter(|e| matches!(e, Event::Token { .. })).count();
        assert_eq!(tokens, reqs[i].max_tokens, "request {i}");
    }
    // Whole prompts batched (padded to the longest of each call), then chunks of at most 5 and
    // 8 prompt tokens per step (a 33-token prompt takes 7 steps), fewer slots than requests.
    for (slots, budget) in [(7, 0), (7, 8), (4, 5), (3, 64)] {
        let together = run(rope, &reqs, slots, budget);
        for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
            same(a, b, &format!("rope {rope}, {slots} slots, prefill budget {budget}: request {i}"));
        }
    }
}

#[test]
fn batched_and_chunked_prefill_match_one_at_a_time_learned_positions() {
    check(false);
}

#[test]
fn batched_and_chunked_prefill_match_one_at_a_time_rotary() {
    check(true);
}

#[test]
fn running_sequences_decode_between_the_chunks_of_a_long_prompt() {
    // Admitted together: the 3-token prompt and the first token of the 40-token one fill the
    // first step's budget of 4; the long prompt then takes 10 more steps of 4 (the last one 3),
    // and every one of them also decodes the short sequence.
    let reqs = [SeqRequest::greedy(vec![1, 2, 3], 40), SeqRequest::greedy((1..=40).collect(), 4)];
    let mut m = model(false);
    let cfg = EngineConfig { max_batch_size: 2, prefill_tokens: 4, ..EngineConfig::default() };
    let (handle, eng) = engine(&m, VOCAB, &cfg).unwrap();
    let (tx, rx) = channel();
    for (tag, req) in reqs.iter().enumerate() {
        let cancel = Arc::new(AtomicBool::new(false));
        handle.submit(Submit { req: req.clone(), tag, events: tx.clone(), cancel, unread: None }).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let t = std::thread::spawn(move || eng.run(&mut m, &s2));
    let mut short_tokens_before_long_first = 0;
    loop {
        match rx.recv_timeout(Duration::from_secs(60)).unwrap() {
            (0, Event::Token { .. }) => short_tokens_before_long_first += 1,
            (1, Event::Token { .. }) => break,
            (_, e) => panic!("unexpected {e:?}"),
        }
    }
    stop.store(true, Ordering::SeqCst);
    t.join().unwrap();
    // The first token (from the prefill) and one decode step in each of the 10 chunk steps.
    assert_eq!(short_tokens_before_long_first, 11);
}
