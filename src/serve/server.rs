//! The HTTP side of `megatron serve`: a pool of HTTP threads parses and validates requests
//! and hands them to ONE model thread (the model is not shared; Megatron likewise serialises
//! requests with a lock): the continuous-batching engine ([`super::continuous`], the default)
//! or the static batcher ([`super::static_batch`]). A failed request never stops the server:
//! errors become HTTP 4xx JSON. HTTP itself is [`super::http`]: bounded, one request per
//! connection.

use super::continuous::{megatron_api, MegatronApi};
use super::http::{read_request, write_json, Deadline, Limits, Request};
use super::static_batch::{api, model_loop, Job};
use crate::generate::LoadedModel;
use anyhow::{anyhow, Result};
use megatron_core::Tokenizer;
use megatron_gpt::GptModel;
use megatron_serving::api::{complete, models, ApiContext, ChatRenderer};
use megatron_serving::openai::{constant_time_eq, ApiError, RequestLimits};
use megatron_serving::EngineConfig;
use serde_json::{json, Value};
use std::io::Read;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, sync_channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How the model thread batches requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Batching {
    /// One decode loop admitting and retiring sequences between steps (any settings mixed).
    Continuous,
    /// Megatron's static batches of queued requests with identical settings (PUT /api only).
    Static,
}

/// Server settings besides the model.
#[derive(Clone)]
pub struct ServeOptions {
    pub http_threads: usize,
    /// Most prompts generated together when batching queued requests.
    pub max_batch_prompts: usize,
    /// Seed of requests without `random_seed` (each gets `seed + request number`).
    pub seed: u64,
    /// Print one line per request (unless the request sets `no_log`).
    pub log: bool,
    pub batching: Batching,
    /// Continuous batching: slots (`max_batch_size` is `max_batch_prompts`), budget, queue.
    pub engine: EngineConfig,
    /// Bearer token every endpoint but `/health` requires.
    pub api_key: Option<String>,
    /// The `model` name of the OpenAI endpoints.
    pub model_name: String,
    /// Renders chat messages (the model's chat template); `None` = `role: content` lines.
    pub chat_template: Option<Arc<super::ChatFn>>,
    /// Bytes of a request body at most (413 beyond).
    pub max_body_bytes: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            http_threads: 16,
            max_batch_prompts: 8,
            seed: 1234,
            log: true,
            batching: Batching::Continuous,
            engine: EngineConfig::default(),
            api_key: None,
            model_name: "megatron".into(),
            chat_template: None,
            max_body_bytes: Limits::default().max_body_bytes,
        }
    }
}

/// A running server; [`ServerHandle::shutdown`] stops it (also on drop).
pub struct ServerHandle {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl ServerHandle {
    /// The bound address (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Blocks until the server stops (it runs until the process ends or `shutdown`).
    pub fn join(mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    pub fn shutdown(mut self) {
        self.stop_threads();
    }

    fn stop_threads(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees `stop` and closes the connection queue.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

/// Binds `host:port` (port 0 = any free port) and starts the accept, HTTP and model threads.
pub fn start(loaded: LoadedModel, host: &str, port: u16, opts: ServeOptions) -> Result<ServerHandle> {
    start_ranks(loaded, Vec::new(), host, port, opts)
}

/// [`start`] with a tensor/pipeline-parallel model: `loaded` holds global rank 0's shard (it
/// runs the engine) and `followers` the other ranks' shards, each of which gets a thread that
/// repeats the engine's model calls ([`megatron_serving::ranks::follow`]). Continuous batching only.
pub fn start_ranks(
    loaded: LoadedModel,
    followers: Vec<GptModel>,
    host: &str,
    port: u16,
    opts: ServeOptions,
) -> Result<ServerHandle> {
    let world = loaded.model.parallel_context().world_size();
    if world != followers.len() + 1 {
        return Err(anyhow!("a model of {world} ranks needs {} follower shards, got {}", world - 1, followers.len()));
    }
    start_inner(loaded, followers, "threads", host, port, opts)
}

/// [`start`] on global rank 0 of an MPI world (`mpirun -np N megatron serve ...`): the other
/// ranks are processes of their own that run [`megatron_serving::ranks::follow`].
pub fn start_mpi_rank0(loaded: LoadedModel, host: &str, port: u16, opts: ServeOptions) -> Result<ServerHandle> {
    start_inner(loaded, Vec::new(), "processes", host, port, opts)
}

/// `/health`'s `parallel` object: how the model is split over ranks and what carries them.
fn layout(model: &GptModel, ranks: &str) -> Value {
    let ctx = model.parallel_context();
    json!({
        "world_size": ctx.world_size(),
        "tensor_model_parallel_size": ctx.grid.tp,
        "pipeline_model_parallel_size": ctx.grid.pp,
        "ranks": if ctx.world_size() == 1 { "single" } else { ranks },
        "communicator": ctx.comm.name(),
        "engine_rank": ctx.rank,
    })
}

fn start_inner(
    loaded: LoadedModel,
    followers: Vec<GptModel>,
    ranks: &str,
    host: &str,
    port: u16,
    opts: ServeOptions,
) -> Result<ServerHandle> {
    let world = loaded.model.parallel_context().world_size();
    let parallel = layout(&loaded.model, ranks);
    if world > 1 && opts.batching == Batching::Static {
        return Err(anyhow!(
            "--batching static decodes at tensor and pipeline parallel size 1; use --batching continuous with --nproc"
        ));
    }
    let listener =
        TcpListener::bind(format!("{host}:{port}")).map_err(|e| anyhow!("cannot listen on {host}:{port}: {e}"))?;
    let mut addr = listener.local_addr()?;
    if addr.ip().is_unspecified() {
        // Shutdown wakes the accept loop by connecting to it.
        addr.set_ip(if addr.is_ipv4() { Ipv4Addr::LOCALHOST.into() } else { Ipv6Addr::LOCALHOST.into() });
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = channel::<Job>();
    let tokenizer = loaded.tokenizer.clone();
    let mut threads = Vec::new();
    let model_stop = stop.clone();
    let max_batch = opts.max_batch_prompts.max(1);
    let mut api = None;
    let (eod, vocab_size) = (loaded.eod, loaded.vocab_size);
    let max_positions = loaded.model.config().max_position_embeddings;
    if opts.batching == Batching::Continuous {
        let cfg = EngineConfig { max_batch_size: max_batch, ..opts.engine.clone() };
        let (handle, engine) = megatron_serving::engine(&loaded.model, loaded.vocab_size, &cfg)?;
        // Started only now: a follower waits for the engine's first plan, which comes next.
        for mut m in followers {
            let rank = m.parallel_context().rank;
            threads.push(std::thread::Builder::new().name(format!("megatron-rank{rank}")).spawn(move || {
                if let Err(e) = megatron_serving::ranks::follow(&mut m) {
                    eprintln!("serving rank {rank} stopped: {e:#}");
                }
            })?);
        }
        let template = opts.chat_template.clone();
        api = Some(ApiContext {
            model_name: opts.model_name.clone(),
            tokenizer: tokenizer.clone(),
            vocab_size,
            eod,
            engine: handle,
            limits: RequestLimits::default(),
            chat_template: template.map(|t| Box::new(move |m: &[Value]| t(m)) as ChatRenderer),
            seed: opts.seed,
            counter: AtomicU64::new(0),
            created: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        });
        threads.push(std::thread::Builder::new().name("megatron-engine".into()).spawn(move || {
            let mut loaded = loaded;
            engine.run(&mut loaded.model, &model_stop);
        })?);
    } else {
        threads.push(std::thread::Builder::new().name("megatron-model".into()).spawn(move || {
            model_loop(loaded, rx, max_batch, model_stop);
        })?);
    }
    let ctx = Arc::new(HttpContext {
        tokenizer: tokenizer.clone(),
        eod,
        colon: tokenizer.encode(":").ok().and_then(|v| v.first().map(|&t| t as i32)),
        max_positions: api.as_ref().map_or(max_positions, |a| a.engine.slot_capacity),
        jobs: Mutex::new(tx),
        counter: AtomicU64::new(0),
        opts: opts.clone(),
        api,
        parallel,
    });
    // Accepted connections wait in a bounded queue; when it is full the accept loop waits and
    // the kernel's backlog holds further clients (no unbounded growth under a flood).
    let n_http = opts.http_threads.max(1);
    let (conn_tx, conn_rx) = sync_channel::<TcpStream>(4 * n_http);
    let conn_rx = Arc::new(Mutex::new(conn_rx));
    for i in 0..n_http {
        let (conn_rx, ctx) = (conn_rx.clone(), ctx.clone());
        threads.push(std::thread::Builder::new().name(format!("megatron-http-{i}")).spawn(move || loop {
            let next = conn_rx.lock().map_err(|_| ()).and_then(|rx| rx.recv().map_err(|_| ()));
            match next {
                Ok(stream) => serve_connection(stream, &ctx),
                Err(()) => return,
            }
        })?);
    }
    let accept_stop = stop.clone();
    threads.push(std::thread::Builder::new().name("megatron-accept".into()).spawn(move || {
        for stream in listener.incoming() {
            if accept_stop.load(Ordering::SeqCst) {
                return; // dropping `conn_tx` ends the HTTP threads
            }
            // Errors here (e.g. too many open files) concern one connection only.
            if let Ok(stream) = stream {
                if conn_tx.send(stream).is_err() {
                    return;
                }
            }
        }
    })?);
    Ok(ServerHandle { addr, stop, threads })
}

/// What the HTTP threads share.
pub(super) struct HttpContext {
    pub(super) tokenizer: Arc<dyn Tokenizer>,
    pub(super) eod: i32,
    pub(super) colon: Option<i32>,
    pub(super) max_positions: usize,
    /// Static batching: the model thread's queue.
    pub(super) jobs: Mutex<Sender<Job>>,
    pub(super) counter: AtomicU64,
    pub(super) opts: ServeOptions,
    /// Continuous batching: the engine and the OpenAI endpoints' context.
    pub(super) api: Option<ApiContext>,
    /// `/health`'s rank layout ([`layout`]).
    pub(super) parallel: Value,
}

/// Megatron's server answers errors as `{"message": ...}` (its CLI reads `['message']`);
/// ours used `{"error": ...}`: both keys carry the same text.
pub fn error_body(message: &str) -> Value {
    json!({ "error": message, "message": message })
}

/// One request on one connection, answered, then the connection is closed.
fn serve_connection(stream: TcpStream, ctx: &HttpContext) {
    let limits = Limits { max_body_bytes: ctx.opts.max_body_bytes, ..Limits::default() };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(10)));
    let _ = stream.set_nodelay(true);
    let Ok(write_half) = stream.try_clone() else { return };
    let Ok(probe) = stream.try_clone() else { return };
    let mut writer = std::io::BufWriter::new(write_half);
    let mut reader = std::io::BufReader::with_capacity(8 << 10, Deadline::new(stream, limits.request_deadline));
    let t0 = std::time::Instant::now();
    let alive = || client_alive(&probe);
    let (status, body, log) = match read_request(&mut reader, &mut writer, &limits) {
        Ok(req) => {
            if let Err(e) = authorize(&req, ctx) {
                (e.status, e.body(), None)
            } else if req.path.starts_with("/v1/") || req.path == "/v1" {
                match v1(&req, ctx, &mut writer, &alive) {
                    Ok(None) => return, // answered by the handler
                    Ok(Some(line)) => {
                        if ctx.opts.log {
                            println!("{line} in {:.3}s", t0.elapsed().as_secs_f64());
                        }
                        return;
                    }
                    Err(e) if e.status == 0 => return,
                    Err(e) => (e.status, e.body(), None),
                }
            } else {
                route(&req, ctx, &alive)
            }
        }
        Err(e) if e.status == 0 => return, // the client went away: nobody to answer
        Err(e) => (e.status, error_body(&e.message), None),
    };
    if status == 0 {
        return; // the client went away while waiting
    }
    if let Some(line) = log {
        println!("{line} in {:.3}s", t0.elapsed().as_secs_f64());
    }
    // A client that went away makes this fail; nothing else is affected.
    let _ = write_json(&mut writer, status, &body.to_string());
    if status != 200 {
        // Unread request bytes would make the close send a reset that can destroy the answer
        // in flight; read (and drop) a bounded amount first, briefly.
        let mut stream = reader.into_inner().inner;
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
        let _ = std::io::copy(&mut (&mut stream).take(1 << 20), &mut std::io::sink());
    }
}

fn route(req: &Request, ctx: &HttpContext, alive: &dyn Fn() -> bool) -> (u16, Value, Option<String>) {
    match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/health") => {
            let mut v = json!({ "status": "ok", "parallel": ctx.parallel });
            if let Some(api) = &ctx.api {
                let s = &api.engine.stats;
                v["active"] = json!(s.active.load(Ordering::SeqCst));
                v["queued"] = json!(s.queued.load(Ordering::SeqCst));
                v["slots"] = json!(api.engine.slots);
                v["finished"] = json!(s.finished.load(Ordering::SeqCst));
                v["cancelled"] = json!(s.cancelled.load(Ordering::SeqCst));
                v["engine"] = s.profile();
            }
            (200, v, None)
        }
        ("PUT", "/api") | ("POST", "/api") if ctx.api.is_some() => {
            let Some(api) = &ctx.api else { return (503, error_body("no engine"), None) };
            let m = MegatronApi { api, colon: ctx.colon, default_seed: ctx.opts.seed };
            match megatron_api(&req.body, &m, &api.engine, alive) {
                Ok((v, log)) => (200, v, (ctx.opts.log && !log.is_empty()).then_some(log)),
                Err((status, e)) => (status, error_body(&e), None),
            }
        }
        ("PUT", "/api") | ("POST", "/api") => match api(&req.body, ctx) {
            Ok((v, log)) => (200, v, log),
            Err(e) => (400, error_body(&e), None),
        },
        (_, "/api") | (_, "/health") => (405, error_body("method not allowed: use PUT /api or GET /health"), None),
        (_, path) => (404, error_body(&format!("no endpoint {path:.200}: use PUT /api or GET /health")), None),
    }
}

/// Whether the client is still connected: a closed socket reads 0 bytes at once; a live one
/// has nothing to read (or pipelined bytes).
fn client_alive(s: &TcpStream) -> bool {
    let _ = s.set_read_timeout(Some(Duration::from_millis(1)));
    let alive = match s.peek(&mut [0u8; 1]) {
        Ok(0) => false,
        Ok(_) => true,
        Err(e) => matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    alive
}

/// `--api-key`: every endpoint but `/health` needs `Authorization: Bearer KEY`.
fn authorize(req: &Request, ctx: &HttpContext) -> Result<(), ApiError> {
    let Some(key) = ctx.opts.api_key.as_deref() else { return Ok(()) };
    if req.path == "/health" {
        return Ok(());
    }
    let given = req.header("authorization").and_then(|h| h.strip_prefix("Bearer ")).unwrap_or("");
    if constant_time_eq(given.trim().as_bytes(), key.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError::new(401, "missing or wrong API key: send `Authorization: Bearer KEY`").code("invalid_api_key"))
    }
}

/// The OpenAI endpoints. `Ok(Some(log))`/`Ok(None)`: answered; `Err`: to be answered.
fn v1(
    req: &Request,
    ctx: &HttpContext,
    w: &mut dyn std::io::Write,
    alive: &dyn Fn() -> bool,
) -> Result<Option<String>, ApiError> {
    let Some(api) = &ctx.api else {
        return Err(ApiError::new(503, "the OpenAI endpoints need `megatron serve --batching continuous`")
            .code("static_batching"));
    };
    match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/v1/models") => {
            write_json(w, 200, &models(api).to_string()).map_err(|e| ApiError::new(0, e.to_string()))?;
            Ok(None)
        }
        ("POST", "/v1/completions") | ("POST", "/v1/chat/completions") => {
            complete(&req.path, &req.body, w, alive, api).map(Some)
        }
        (_, "/v1/models") | (_, "/v1/completions") | (_, "/v1/chat/completions") => {
            Err(ApiError::new(405, format!("method {} not allowed on {}", req.method, req.path)))
        }
        (_, p) => Err(ApiError::new(
            404,
            format!("no endpoint {p:.200}: use /v1/completions, /v1/chat/completions or /v1/models"),
        )
        .code("unknown_url")),
    }
}
