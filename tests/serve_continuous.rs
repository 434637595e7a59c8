//! Continuous batching (`megatron serve --batching continuous`) with a tiny random GPT and the
//! NullTokenizer (prompts are ids): per-request seeds reproduce exactly whatever shares the
//! decode steps, greedy equals the static generator, the OpenAI endpoints (JSON, SSE, n, stop,
//! logprobs, echo, errors, API key), back-pressure (429) and a disconnect freeing its slot.

use megatron::generate::{GenerationParams, Generator, LoadedModel, SamplingParams};
use megatron::serve::{start, ServeOptions, ServerHandle};
use megatron_core::{Backend, ParallelContext, Tokenizer};
use megatron_gpt::{GptConfig, GptModel};
use megatron_serving::engine::{engine, EngineConfig, Event, SeqRequest, Submit};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn model() -> GptModel {
    model_with(64)
}

/// `positions` long enough makes a generation slow enough to be cancelled mid-way.
fn model_with(positions: usize) -> GptModel {
    let mut c = GptConfig::new(2, 32, 4, positions, 64);
    c.hidden_dropout = 0.0;
    c.attention_dropout = 0.0;
    c.make_vocab_size_divisible_by = 16;
    let backend: Arc<dyn Backend> = Arc::new(megatron_cpu::CpuBackend::new());
    GptModel::new(c, backend, ParallelContext::single()).unwrap()
}

fn loaded(positions: usize) -> LoadedModel {
    let tokenizer: Arc<dyn Tokenizer> = Arc::new(megatron_tokenizers::NullTokenizer::new(63).unwrap());
    LoadedModel { model: model_with(positions), tokenizer, vocab_size: 64, eod: 63, args: Value::Null, iteration: 0 }
}

fn sampled(prompt: Vec<i32>, max_tokens: usize, temperature: f32, top_k: usize, seed: u64) -> SeqRequest {
    SeqRequest {
        sampling: SamplingParams { temperature, top_k, ..SamplingParams::default() },
        seed,
        ..SeqRequest::greedy(prompt, max_tokens)
    }
}

/// Runs `waves` of requests through one engine (each wave submitted after the previous wave's
/// first `delay` tokens) and returns every request's tokens, in submission order.
fn run_engine(waves: Vec<Vec<SeqRequest>>, slots: usize) -> Vec<Vec<i32>> {
    let mut m = model();
    let cfg = EngineConfig { max_batch_size: slots, queue_limit: 64, ..EngineConfig::default() };
    let (handle, eng) = engine(&m, 64, &cfg).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let t = std::thread::spawn(move || eng.run(&mut m, &s2));
    let (tx, rx) = channel();
    let mut n = 0;
    let total: usize = waves.iter().map(Vec::len).sum();
    let mut out = vec![Vec::new(); total];
    let mut done = 0;
    for wave in waves {
        for req in wave {
            let s = Submit { req, tag: n, events: tx.clone(), cancel: Arc::new(AtomicBool::new(false)), unread: None };
            handle.submit(s).unwrap();
            n += 1;
        }
        // Let the wave decode a few steps before the next one joins mid-flight.
        let mut seen = 0;
        while seen < 3 {
            match rx.recv_timeout(Duration::from_secs(30)).unwrap() {
                (tag, Event::Token { id, .. }) => {
                    out[tag].push(id);
                    seen += 1;
                }
                (_, Event::Done(_)) => done += 1,
                (_, e) => panic!("{e:?}"),
            }
        }
    }
    while done < total {
        match rx.recv_timeout(Duration::from_secs(30)).unwrap() {
            (tag, Event::Token { id, .. }) => out[tag].push(id),
            (_, Event::Done(_)) => done += 1,
            (_, e) => panic!("{e:?}"),
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    t.join().unwrap();
    out
}

#[test]
fn seeded_requests_reproduce_whatever_shares_their_steps() {
    let a = || sampled(vec![5, 9, 2, 7], 12, 1.3, 0, 42);
    let alone = run_engine(vec![vec![a()]], 4);
    assert_eq!(alone[0].len(), 12);
    // Companions with other settings, lengths and seeds, before and after it, in other slots.
    let busy = run_engine(
        vec![
            vec![sampled(vec![1; 9], 20, 0.7, 5, 1), SeqRequest::greedy(vec![3, 4], 16)],
            vec![a(), sampled(vec![8, 8, 8], 6, 2.0, 0, 9)],
            vec![sampled(vec![2; 17], 10, 1.0, 0, 3)],
        ],
        4,
    );
    assert_eq!(busy[2], alone[0], "the seeded request changed with its batch companions");
    // Another seed gives another sequence (the test can fail).
    let other = run_engine(vec![vec![sampled(vec![5, 9, 2, 7], 12, 1.3, 0, 43)]], 4);
    assert_ne!(other[0], alone[0]);
    // More requests than slots: they queue and still all finish with the same tokens.
    let queued = run_engine(vec![vec![a(), a(), a(), a(), a()]], 2);
    assert!(queued.iter().all(|t| *t == alone[0]));
}

#[test]
fn greedy_matches_the_static_generator() {
    let prompts: Vec<Vec<i32>> = vec![vec![1, 2, 3], vec![7], vec![4, 4, 9, 10, 11, 12], vec![30, 20]];
    let reqs: Vec<SeqRequest> = prompts.iter().map(|p| SeqRequest::greedy(p.clone(), 10)).collect();
    let cont = run_engine(vec![reqs[..2].to_vec(), reqs[2..].to_vec()], 3);
    let mut m = model();
    for (p, got) in prompts.iter().zip(&cont) {
        let params =
            GenerationParams { tokens_to_generate: 10, sampling: SamplingParams::greedy(), ..Default::default() };
        let mut g = Generator { model: &mut m, vocab_size: 64, pad_id: 63 };
        let want = g.generate(std::slice::from_ref(p), &params, &mut |_, _| true).unwrap();
        assert_eq!(&want.tokens[0][p.len()..], &got[..], "prompt {p:?}");
    }
}

fn server(positions: usize, opts: ServeOptions) -> ServerHandle {
    start(loaded(positions), "127.0.0.1", 0, ServeOptions { http_threads: 8, log: false, ..opts }).unwrap()
}

fn request(addr: SocketAddr, method: &str, path: &str, body: &str, extra: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let status = raw.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, raw.split_once("\r\n\r\n").map(|x| x.1.to_string()).unwrap_or_default())
}

fn post(addr: SocketAddr, path: &str, body: Value) -> (u16, Value) {
    let (status, text) = request(addr, "POST", path, &body.to_string(), "");
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

#[test]
fn openai_endpoints() {
    // A "template" the NullTokenizer can read: the contents joined by spaces.
    let template: Arc<megatron::serve::ChatFn> =
        Arc::new(|m: &[Value]| Ok(m.iter().filter_map(|x| x["content"].as_str()).collect::<Vec<_>>().join(" ")));
    let srv = server(64, ServeOptions { chat_template: Some(template), ..ServeOptions::default() });
    let addr = srv.addr();
    let (s, v) = request(addr, "GET", "/v1/models", "", "");
    assert!(s == 200 && v.contains("\"megatron\""), "{v}");

    let (s, v) =
        post(addr, "/v1/completions", json!({"prompt": "1 2 3", "max_tokens": 5, "temperature": 0, "logprobs": 2}));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["usage"], json!({"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}));
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 5);
    assert!(lp["token_logprobs"][0].as_f64().unwrap() <= 0.0);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    // Greedy is the same through PUT /api.
    let (s, m) = post(addr, "/api", json!({"prompts": ["1 2 3"], "tokens_to_generate": 5, "top_k": 1}));
    assert_eq!(s, 200, "{m}");
    // (The NullTokenizer joins ids with spaces: the completion text has no leading one.)
    assert_eq!(m["text"][0].as_str().unwrap(), format!("1 2 3 {text}"));

    // echo + logprobs: the prompt comes first, its first token without a log-prob.
    let (_, v) = post(
        addr,
        "/v1/completions",
        json!({"prompt": [4, 5], "max_tokens": 2, "echo": true, "logprobs": 0, "temperature": 0}),
    );
    assert!(v["choices"][0]["text"].as_str().unwrap().starts_with("4 5"), "{v}");
    assert_eq!(v["choices"][0]["logprobs"]["token_logprobs"][0], Value::Null);
    assert_eq!(v["choices"][0]["logprobs"]["tokens"].as_array().unwrap().len(), 4);

    // n > 1 with a seed: distinct choices, reproducible.
    let body = json!({"prompt": "7 8", "max_tokens": 8, "n": 3, "seed": 11, "temperature": 1.5});
    let (s, a) = post(addr, "/v1/completions", body.clone());
    assert_eq!((s, a["choices"].as_array().unwrap().len()), (200, 3), "{a}");
    assert_eq!(post(addr, "/v1/completions", body).1["choices"], a["choices"]);
    // Each choice ends at 8 tokens or at end-of-text (63; counted, not shown).
    let lengths = a["choices"].as_array().unwrap().iter().filter(|c| c["finish_reason"] == "length").count();
    let used = a["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(used >= 8 * lengths as u64 + (3 - lengths as u64) && used <= 24, "{a}");
    assert_ne!(a["choices"][0]["text"], a["choices"][1]["text"]);

    // A stop sequence cuts the text (it is not included) and ends the choice.
    let (_, long) =
        post(addr, "/v1/completions", json!({"prompt": "3 1", "max_tokens": 12, "temperature": 1.5, "seed": 3}));
    let long = long["choices"][0]["text"].as_str().unwrap().to_string();
    let stop = format!(" {}", long.split(' ').nth(3).unwrap());
    let body = json!({"prompt": "3 1", "max_tokens": 12, "temperature": 1.5, "seed": 3, "stop": [stop.clone(), "zz"]});
    let (_, v) = post(addr, "/v1/completions", body);
    assert_eq!(v["choices"][0]["text"].as_str().unwrap(), &long[..long.find(&stop).unwrap()], "{v} {stop:?}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // Chat, streamed.
    let body = json!({"messages": [{"role": "user", "content": "1 2"}], "max_tokens": 4, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true}});
    let (s, raw) = request(addr, "POST", "/v1/chat/completions", &body.to_string(), "");
    assert_eq!(s, 200, "{raw}");
    let events: Vec<Value> = raw
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .take_while(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(raw.trim_end().ends_with("data: [DONE]"), "{raw}");
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = events.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect();
    let (_, plain) = post(
        addr,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "1 2"}], "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!(streamed, plain["choices"][0]["message"]["content"].as_str().unwrap());
    assert_eq!(events.last().unwrap()["usage"]["completion_tokens"], 4);

    // Errors in OpenAI's shape.
    for (path, body, status, param) in [
        ("/v1/completions", json!({"prompt": "1", "temperature": 5}), 400, Some("temperature")),
        ("/v1/completions", json!({"prompt": "1", "model": "gpt-9"}), 404, Some("model")),
        ("/v1/completions", json!({"prompt": "1 2", "max_tokens": 63}), 400, Some("max_tokens")),
        ("/v1/completions", json!({"prompt": "1 999"}), 422, None),
        ("/v1/chat/completions", json!({"messages": []}), 400, Some("messages")),
        ("/v1/nothing", json!({}), 404, None),
    ] {
        let (s, v) = post(addr, path, body.clone());
        assert_eq!(s, status, "{body} -> {v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert_eq!(v["error"]["param"].as_str(), param, "{v}");
    }
    // A body over the limit is refused from its Content-Length, before it is read.
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "POST /v1/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n{{", 5 << 20).unwrap();
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    assert!(raw.starts_with("HTTP/1.1 413"), "{raw:.200}");
    srv.shutdown();
}

#[test]
fn api_key_back_pressure_and_disconnects() {
    let opts = ServeOptions {
        api_key: Some("sekrit".into()),
        max_batch_prompts: 1,
        engine: EngineConfig { queue_limit: 1, ..EngineConfig::default() },
        ..ServeOptions::default()
    };
    let srv = server(4096, opts);
    let addr = srv.addr();
    let body = json!({"prompt": "1", "max_tokens": 1}).to_string();
    assert_eq!(request(addr, "POST", "/v1/completions", &body, "").0, 401);
    assert_eq!(request(addr, "POST", "/v1/completions", &body, "Authorization: Bearer sekriT\r\n").0, 401);
    assert_eq!(request(addr, "POST", "/v1/completions", &body, "Authorization: Bearer sekrit\r\n").0, 200);
    assert_eq!(request(addr, "GET", "/health", "", "").0, 200); // health needs no key

    // One slot, one queue place: of 4 concurrent long requests at least one is refused with 429.
    let long = json!({"prompt": "1 2", "max_tokens": 2000, "temperature": 0}).to_string();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let long = long.clone();
            std::thread::spawn(move || {
                request(addr, "POST", "/v1/completions", &long, "Authorization: Bearer sekrit\r\n")
            })
        })
        .collect();
    let statuses: Vec<u16> = threads.into_iter().map(|t| t.join().unwrap().0).collect();
    assert!(statuses.contains(&429) && statuses.contains(&200), "{statuses:?}");

    // A streaming client that goes away after its first event frees the slot at once (4000
    // tokens at 4096 positions take seconds; the cancellation counter shows it was cut short).
    let stream = json!({"prompt": "1 2", "max_tokens": 4000, "temperature": 0, "stream": true}).to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer sekrit\r\nContent-Length: {}\r\n\r\n{stream}",
        stream.len()
    )
    .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        r.read_line(&mut line).unwrap();
    }
    drop(r);
    s.shutdown(std::net::Shutdown::Both).unwrap();
    drop(s);
    let t0 = Instant::now();
    loop {
        let (_, h) = request(addr, "GET", "/health", "", "");
        let h: Value = serde_json::from_str(&h).unwrap();
        if h["active"] == 0 && h["queued"] == 0 {
            assert_eq!(h["cancelled"], 1, "{h}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the slot was not freed: {h}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // ... and the server still answers.
    assert_eq!(request(addr, "POST", "/v1/completions", &body, "Authorization: Bearer sekrit\r\n").0, 200);
    srv.shutdown();
}

#[test]
fn kv_cache_budget_limits_the_slots() {
    let m = model();
    let per_slot = megatron_gpt::SlotKvCache::bytes_per_slot(&m, 64);
    assert_eq!(per_slot, 2 * 2 * 64 * 32 * 4); // layers × (k, v) × tokens × hidden × f32
    let cfg = |budget| EngineConfig { max_batch_size: 8, kv_cache_budget: budget, ..EngineConfig::default() };
    assert_eq!(engine(&m, 64, &cfg(None)).unwrap().0.slots, 8);
    assert_eq!(engine(&m, 64, &cfg(Some(3 * per_slot + 1))).unwrap().0.slots, 3);
    let e = engine(&m, 64, &cfg(Some(per_slot - 1))).err().unwrap();
    assert!(format!("{e:#}").contains("holds no slot"), "{e:#}");
    assert_eq!(megatron::serve::parse_bytes("512MiB"), Ok(512 << 20));
    assert_eq!(megatron::serve::parse_bytes("3"), Ok(3));
    assert!(megatron::serve::parse_bytes("2 parsecs").is_err());
}

#[test]
fn static_batching_still_serves_put_api() {
    let srv = server(64, ServeOptions { batching: megatron::serve::Batching::Static, ..ServeOptions::default() });
    let addr = srv.addr();
    let greedy = json!({"prompts": ["1 2 3", "4"], "tokens_to_generate": 5, "top_k": 1});
    let (s, st) = post(addr, "/api", greedy.clone());
    assert_eq!(s, 200, "{st}");
    let (s, v) = post(addr, "/api", json!({"prompts": ["1 2 3"], "tokens_to_generate": 62}));
    assert!(s == 400 && v["error"].as_str().unwrap().contains("exceeds the model's context"), "{v}");
    let (s, v) = post(addr, "/v1/completions", json!({"prompt": "1"}));
    assert_eq!((s, v["error"]["code"].as_str()), (503, Some("static_batching")), "{v}");
    srv.shutdown();
    // The same greedy request through the continuous engine gives the same tokens.
    let srv = server(64, ServeOptions::default());
    assert_eq!(post(srv.addr(), "/api", greedy).1["tokens"], st["tokens"]);
    srv.shutdown();
}

#[test]
fn a_slow_consumer_pauses_only_its_own_sequence() {
    use megatron_serving::engine::MAX_UNREAD_EVENTS;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mut m = model();
    let cfg = EngineConfig { max_batch_size: 2, ..EngineConfig::default() };
    let (handle, eng) = engine(&m, 64, &cfg).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let t = std::thread::spawn(move || eng.run(&mut m, &s2));
    // A consumer that reads nothing (its own channel) and one that drains (another channel).
    let (slow_tx, slow_rx) = channel();
    let unread = Arc::new(AtomicUsize::new(0));
    let slow = Submit {
        req: SeqRequest::greedy(vec![1, 2], 60),
        tag: 0,
        events: slow_tx,
        cancel: Arc::new(AtomicBool::new(false)),
        unread: Some(unread.clone()),
    };
    handle.submit(slow).unwrap();
    let (tx, rx) = channel();
    let fast = Submit {
        req: SeqRequest::greedy(vec![3, 4], 50),
        tag: 1,
        events: tx,
        cancel: Arc::new(AtomicBool::new(false)),
        unread: Some(Arc::new(AtomicUsize::new(0))),
    };
    // The fast consumer tells the loop of every event it takes.
    let fast_unread = fast.unread.clone().unwrap();
    handle.submit(fast).unwrap();
    let mut fast_tokens = 0;
    loop {
        match rx.recv_timeout(Duration::from_secs(30)).unwrap() {
            (_, Event::Token { .. }) => fast_tokens += 1,
            (_, Event::Done(_)) => break,
            (_, e) => panic!("{e:?}"),
        }
        Submit::taken(&fast_unread);
    }
    assert_eq!(fast_tokens, 50, "the other sequence ran to its end");
    // The slow sequence stopped at the bound, holding its slot.
    assert_eq!(unread.load(Ordering::SeqCst), MAX_UNREAD_EVENTS);
    let held: Vec<_> = slow_rx.try_iter().collect();
    assert_eq!(held.len(), MAX_UNREAD_EVENTS);
    // (the gauge is published at the end of the step that sent the fast one's Done)
    let t0 = Instant::now();
    while handle.stats.active.load(Ordering::SeqCst) != 1 {
        assert!(t0.elapsed() < Duration::from_secs(10), "active stays {:?}", handle.stats.active);
        std::thread::sleep(Duration::from_millis(5));
    }
    // Reading on lets it finish with all its tokens.
    held.iter().for_each(|_| Submit::taken(&unread));
    let mut tokens = held.len();
    loop {
        match slow_rx.recv_timeout(Duration::from_secs(30)).unwrap() {
            (_, Event::Token { .. }) => tokens += 1,
            (_, Event::Done(_)) => break,
            (_, e) => panic!("{e:?}"),
        }
        Submit::taken(&unread);
    }
    assert_eq!(tokens, 60);
    stop.store(true, Ordering::SeqCst);
    t.join().unwrap();
}
