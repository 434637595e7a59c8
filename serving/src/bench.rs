//! The load generator of `megatron bench serve`: `clients` threads on loopback, each sending
//! `requests` requests one after another with its own mix of settings and lengths (a seeded
//! generator, so every run sends the same workload), then a report of requests/s, output
//! tokens/s and percentiles of latency, time to first token (TTFT) and inter-token latency
//! (ITL). Every socket has a timeout, so a run is bounded.
//!
//! Two protocols: `PUT /api` (Megatron's; the whole answer at once, so TTFT is the latency) and
//! `POST /v1/completions` with `"stream": true` (server-sent events; TTFT is the first event
//! with text, ITL the gaps between later ones).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The workload.
#[derive(Clone, Debug)]
pub struct Workload {
    pub clients: usize,
    pub requests_per_client: usize,
    /// Prompt tokens (inclusive range); prompts are random ids written as text (NullTokenizer).
    pub prompt_len: (usize, usize),
    pub output_len: (usize, usize),
    /// Ids drawn below this.
    pub vocab: usize,
    pub seed: u64,
    pub timeout: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `PUT /api`.
    Megatron,
    /// `POST /v1/completions`, streamed.
    OpenAiStream,
}

/// What one run measured (seconds).
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub ok: usize,
    pub errors: usize,
    pub wall: f64,
    pub output_tokens: usize,
    pub latency: Vec<f64>,
    pub ttft: Vec<f64>,
    pub itl: Vec<f64>,
    pub first_error: Option<String>,
}

/// The `q`-quantile (nearest rank) of `v`, NaN if empty.
pub fn percentile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1]
}

impl Report {
    pub fn json(&self) -> Value {
        let ms = |v: &[f64], q| (percentile(v, q) * 1e3 * 10.0).round() / 10.0;
        json!({
            "ok": self.ok, "errors": self.errors, "wall_s": self.wall,
            "req_per_s": self.ok as f64 / self.wall,
            "output_tok_per_s": self.output_tokens as f64 / self.wall,
            "latency_ms": { "p50": ms(&self.latency, 0.5), "p99": ms(&self.latency, 0.99) },
            "ttft_ms": { "p50": ms(&self.ttft, 0.5), "p99": ms(&self.ttft, 0.99) },
            "itl_ms": { "p50": ms(&self.itl, 0.5), "p99": ms(&self.itl, 0.99) },
            "first_error": self.first_error,
        })
    }
}

/// The settings of client `c`'s requests: four kinds, half of the clients seeded, so a static
/// batcher finds few requests it may batch together.
fn settings(c: usize) -> Value {
    let mut v = match c % 4 {
        0 => json!({ "top_k": 1 }),
        1 => json!({ "temperature": 0.8, "top_k": 40 }),
        2 => json!({ "temperature": 1.0, "top_p": 0.9 }),
        _ => json!({ "temperature": 0.7 }),
    };
    if c % 8 >= 4 {
        v["random_seed"] = json!(c);
    }
    v
}

fn openai_body(megatron: &Value, prompt: &str, max_tokens: usize) -> Value {
    let mut b = json!({ "prompt": prompt, "max_tokens": max_tokens, "stream": true,
        "stream_options": { "include_usage": true } });
    if megatron["top_k"] == json!(1) {
        b["temperature"] = json!(0);
    } else {
        b["temperature"] = megatron["temperature"].clone();
        for k in ["top_k", "top_p"] {
            if !megatron[k].is_null() {
                b[k] = megatron[k].clone();
            }
        }
    }
    if !megatron["random_seed"].is_null() {
        b["seed"] = megatron["random_seed"].clone();
    }
    b
}

struct One {
    latency: f64,
    ttft: f64,
    itl: Vec<f64>,
    tokens: usize,
}

fn send(addr: SocketAddr, method: &str, path: &str, body: &str, timeout: Duration) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.set_nodelay(true)?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    Ok(s)
}

fn err(m: impl Into<String>) -> std::io::Error {
    std::io::Error::other(m.into())
}

fn megatron_request(addr: SocketAddr, body: &Value, prompt_len: usize, timeout: Duration) -> std::io::Result<One> {
    let t0 = Instant::now();
    let mut s = send(addr, "PUT", "/api", &body.to_string(), timeout)?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let latency = t0.elapsed().as_secs_f64();
    let (head, body) = raw.split_once("\r\n\r\n").ok_or_else(|| err("no HTTP header"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(err(format!("{:.80} {body:.200}", head)));
    }
    let v: Value = serde_json::from_str(body).map_err(|e| err(format!("bad JSON: {e}")))?;
    let tokens = v["tokens"][0].as_array().map_or(0, |t| t.len().saturating_sub(prompt_len));
    Ok(One { latency, ttft: latency, itl: Vec::new(), tokens })
}

fn openai_request(addr: SocketAddr, body: &Value, timeout: Duration) -> std::io::Result<One> {
    let t0 = Instant::now();
    let s = send(addr, "POST", "/v1/completions", &body.to_string(), timeout)?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    if !line.starts_with("HTTP/1.1 200") {
        let mut rest = String::new();
        let _ = r.read_to_string(&mut rest);
        return Err(err(format!("{} {rest:.300}", line.trim())));
    }
    let (mut ttft, mut last, mut itl, mut tokens) = (None, 0.0, Vec::new(), 0);
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(err("stream ended without [DONE]"));
        }
        let Some(data) = line.trim_end().strip_prefix("data: ") else { continue };
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data).map_err(|e| err(format!("bad event: {e}")))?;
        if let Some(e) = v.get("error") {
            return Err(err(format!("error event: {e}")));
        }
        if let Some(u) = v["usage"]["completion_tokens"].as_u64() {
            tokens = u as usize;
        }
        if v["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty()) {
            let now = t0.elapsed().as_secs_f64();
            match ttft {
                None => ttft = Some(now),
                Some(_) => itl.push(now - last),
            }
            last = now;
        }
    }
    let latency = t0.elapsed().as_secs_f64();
    Ok(One { latency, ttft: ttft.unwrap_or(latency), itl, tokens })
}

/// Runs `w` against the server at `addr`.
pub fn run(addr: SocketAddr, w: &Workload, proto: Protocol) -> Report {
    let t0 = Instant::now();
    let results: Vec<Vec<std::io::Result<One>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..w.clients)
            .map(|c| {
                scope.spawn(move || {
                    let mut rng = ChaCha8Rng::seed_from_u64(w.seed.wrapping_add(c as u64));
                    (0..w.requests_per_client)
                        .map(|_| {
                            let pl = rng.gen_range(w.prompt_len.0..=w.prompt_len.1);
                            let ol = rng.gen_range(w.output_len.0..=w.output_len.1);
                            let prompt: Vec<String> =
                                (0..pl).map(|_| rng.gen_range(0..w.vocab.max(2) - 1).to_string()).collect();
                            let prompt = prompt.join(" ");
                            let mut m = settings(c);
                            m["prompts"] = json!([prompt]);
                            m["tokens_to_generate"] = json!(ol);
                            m["no_log"] = json!(true);
                            match proto {
                                Protocol::Megatron => megatron_request(addr, &m, pl, w.timeout),
                                Protocol::OpenAiStream => {
                                    openai_request(addr, &openai_body(&m, &prompt, ol), w.timeout)
                                }
                            }
                        })
                        .collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_default()).collect()
    });
    let mut rep = Report { wall: t0.elapsed().as_secs_f64(), ..Report::default() };
    for r in results.into_iter().flatten() {
        match r {
            Ok(o) => {
                rep.ok += 1;
                rep.output_tokens += o.tokens;
                rep.latency.push(o.latency);
                rep.ttft.push(o.ttft);
                rep.itl.extend(o.itl);
            }
            Err(e) => {
                rep.errors += 1;
                rep.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    rep
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!((percentile(&v, 0.5), percentile(&v, 0.99), percentile(&v, 1.0)), (50.0, 99.0, 100.0));
        assert!(percentile(&[], 0.5).is_nan());
    }

    #[test]
    fn openai_body_mirrors_the_settings() {
        let b = openai_body(&settings(0), "1 2", 5);
        assert_eq!((b["temperature"].clone(), b["max_tokens"].clone()), (json!(0), json!(5)));
        let b = openai_body(&settings(5), "1 2", 5);
        assert_eq!((b["top_k"].clone(), b["seed"].clone()), (json!(40), json!(5)));
    }
}
