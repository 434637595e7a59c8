//! `megatron bench serve`: the same seeded workload (`clients` concurrent loopback clients of
//! mixed sampling settings, prompt and output lengths) against `megatron serve` with each
//! batching mode, started in-process on an ephemeral loopback port over a random-weight GPT of
//! a preset shape (or a checkpoint with `--load`). Reports requests/s, output tokens/s and
//! latency/TTFT/ITL percentiles per mode, and continuous/static ratios. Release builds only for
//! numbers; the workload is bounded (`clients × requests`, every socket with a timeout).

use crate::generate::LoadedModel;
use crate::serve::{start, Batching, ServeOptions};
use anyhow::{bail, Context, Result};
use clap::Args;
use megatron_core::{ParallelContext, Registry, Tokenizer};
use megatron_gpt::{GptConfig, GptModel};
use megatron_serving::bench::{run as run_load, Protocol, Workload};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

#[derive(Args, Debug, Clone)]
pub struct ServeBenchArgs {
    /// Random-weight model shape: `tiny` (4 layers, 256 hidden, 4 heads, 256 positions, GPT-2
    /// vocabulary) or `gpt2-124m` (12/768/12, 1024 positions).
    #[arg(long, default_value = "tiny")]
    pub preset: String,
    /// Concurrent clients.
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// Requests per client (sent one after another).
    #[arg(long, default_value_t = 2)]
    pub requests: usize,
    /// Prompt tokens, `MIN:MAX`.
    #[arg(long, default_value = "8:64")]
    pub prompt_len: String,
    /// Output tokens, `MIN:MAX`.
    #[arg(long, default_value = "8:64")]
    pub output_len: String,
    /// Modes to compare, in order.
    #[arg(long, value_enum, num_args = 1.., default_values = ["continuous", "static"])]
    pub batching: Vec<Batching>,
    /// Slots (continuous) / prompts per batch (static).
    #[arg(long, default_value_t = 16)]
    pub max_batch_size: usize,
    /// Prompt tokens the continuous engine prefills per step at most (0 = no limit).
    #[arg(long, default_value_t = megatron_serving::engine::PREFILL_TOKENS)]
    pub prefill_tokens: usize,
    /// Also run the OpenAI streaming protocol against the continuous server (TTFT, ITL).
    #[arg(long)]
    pub stream: bool,
    #[arg(long)]
    pub threads: Option<usize>,
    /// Seconds a single request may take before it counts as an error.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
}

fn range(s: &str, what: &str) -> Result<(usize, usize)> {
    let (a, b) = s.split_once(':').unwrap_or((s, s));
    let (a, b): (usize, usize) = (
        a.trim().parse().with_context(|| format!("--{what} `{s}`: expected MIN:MAX"))?,
        b.trim().parse().with_context(|| format!("--{what} `{s}`: expected MIN:MAX"))?,
    );
    if a == 0 || a > b {
        bail!("--{what} `{s}`: need 1 <= MIN <= MAX");
    }
    Ok((a, b))
}

fn model(registry: &Registry, preset: &str, threads: Option<usize>) -> Result<LoadedModel> {
    let (layers, hidden, heads, seq) = match preset {
        "tiny" => (4, 256, 4, 256),
        "gpt2-124m" => (12, 768, 12, 1024),
        other => bail!("unknown --preset `{other}`: expected `tiny` or `gpt2-124m`"),
    };
    let vocab = 50257;
    let mut c = GptConfig::new(layers, hidden, heads, seq, vocab);
    c.hidden_dropout = 0.0;
    c.attention_dropout = 0.0;
    let backend = registry.backend("cpu", json!({ "threads": threads }))?;
    let model = GptModel::new(c, backend, ParallelContext::single())?;
    let tokenizer: Arc<dyn Tokenizer> = Arc::new(megatron_tokenizers::NullTokenizer::new(vocab - 1)?);
    let eod = vocab as i32 - 1;
    Ok(LoadedModel { model, tokenizer, vocab_size: vocab, eod, args: Value::Null, iteration: 0 })
}

/// The server's `/health` answer.
fn health(addr: std::net::SocketAddr) -> Option<Value> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    serde_json::from_str(raw.split_once("\r\n\r\n")?.1).ok()
}

pub fn run(args: &ServeBenchArgs, registry: &Registry) -> Result<()> {
    let w = Workload {
        clients: args.clients.max(1),
        requests_per_client: args.requests.max(1),
        prompt_len: range(&args.prompt_len, "prompt-len")?,
        output_len: range(&args.output_len, "output-len")?,
        vocab: 50256,
        seed: args.seed,
        timeout: Duration::from_secs(args.timeout.max(1)),
    };
    println!(
        "bench serve: preset {}, {} clients x {} requests, prompt {:?}, output {:?} tokens, max batch {}, prefill tokens {}",
        args.preset, w.clients, w.requests_per_client, w.prompt_len, w.output_len, args.max_batch_size, args.prefill_tokens
    );
    let mut results: Vec<(String, Value)> = Vec::new();
    for &mode in &args.batching {
        let protos: &[Protocol] = match (mode, args.stream) {
            (Batching::Continuous, true) => &[Protocol::Megatron, Protocol::OpenAiStream],
            _ => &[Protocol::Megatron],
        };
        for &proto in protos {
            let loaded = model(registry, &args.preset, args.threads)?;
            let opts = ServeOptions {
                http_threads: w.clients + 4,
                max_batch_prompts: args.max_batch_size,
                log: false,
                batching: mode,
                engine: megatron_serving::EngineConfig {
                    max_batch_size: args.max_batch_size,
                    queue_limit: w.clients * 2,
                    prefill_tokens: args.prefill_tokens,
                    ..Default::default()
                },
                ..ServeOptions::default()
            };
            let server = start(loaded, "127.0.0.1", 0, opts)?;
            let rep = run_load(server.addr(), &w, proto);
            let engine = health(server.addr()).map(|h| h["engine"].clone()).unwrap_or(Value::Null);
            server.shutdown();
            let name =
                format!("{mode:?}/{}", if proto == Protocol::Megatron { "PUT /api" } else { "SSE /v1/completions" });
            let mut v = rep.json();
            v["mode"] = json!(name);
            if !engine.is_null() {
                v["engine"] = engine; // where the continuous engine's time went
            }
            println!("{v}");
            results.push((name, v));
        }
    }
    let get = |m: &str| results.iter().find(|(n, _)| n.starts_with(m) && n.ends_with("PUT /api")).map(|x| &x.1);
    if let (Some(c), Some(s)) = (get("Continuous"), get("Static")) {
        let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        let p99 = |v: &Value| v["latency_ms"]["p99"].as_f64().unwrap_or(f64::NAN);
        println!(
            "continuous / static (PUT /api): output tok/s x{:.2}, req/s x{:.2}, p99 latency x{:.2}",
            f(c, "output_tok_per_s") / f(s, "output_tok_per_s"),
            f(c, "req_per_s") / f(s, "req_per_s"),
            p99(c) / p99(s)
        );
    }
    Ok(())
}
