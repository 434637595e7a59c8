//! `megatron serve`: Megatron's REST text-generation server (SPEC §8.1) — `PUT /api` and
//! `GET /health` — over a checkpoint. Loopback by default.

/// The bounded HTTP/1.1 layer lives in the serving crate.
pub use megatron_serving::http;
pub mod continuous;
pub mod ranks;
pub mod request;
pub mod server;
mod static_batch;

use crate::generate::{load_model, LoadArgs};
use anyhow::Result;
use clap::Args;
use megatron_core::Registry;
pub use server::{start, start_ranks, Batching, ServeOptions, ServerHandle};

#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    #[arg(long, default_value_t = 5000)]
    pub port: u16,
    /// Address to bind; use 0.0.0.0 to accept remote clients (Megatron's default).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Threads handling connections; each in-flight request holds one (64 lets 64 clients wait
    /// on the engine at once; generation itself runs on one model thread).
    #[arg(long, default_value_t = 64)]
    pub http_threads: usize,
    /// Most sequences decoded together: the kv cache slots of continuous batching, or the
    /// prompts of one static batch (Megatron's --inference-max-requests).
    #[arg(long, alias = "inference-max-requests", default_value_t = 16)]
    pub max_batch_size: usize,
    /// `continuous` (in-flight batching, the OpenAI endpoints) or `static` (Megatron's batches of
    /// identical-settings requests; PUT /api only).
    #[arg(long, value_enum, default_value = "continuous")]
    pub batching: Batching,
    /// Memory the kv cache may use (bytes, or with KiB/MiB/GiB); fewer slots than
    /// --max-batch-size are made if they do not fit. Default: no limit beyond the slots.
    #[arg(long, value_parser = parse_bytes)]
    pub kv_cache_budget: Option<usize>,
    /// Tokens per kv cache slot (prompt + generated); default the model's max_position_embeddings.
    #[arg(long)]
    pub max_seq_len: Option<usize>,
    /// Sequences waiting for a slot at most; beyond it requests are answered 429.
    #[arg(long, default_value_t = 64)]
    pub max_queue: usize,
    /// Prompt tokens the continuous engine prefills per step at most, several prompts per model
    /// call; a longer prompt is fed in chunks with decode steps in between (0 = no limit).
    #[arg(long, default_value_t = megatron_serving::engine::PREFILL_TOKENS)]
    pub prefill_tokens: usize,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health (also from the
    /// MEGATRON_API_KEY environment variable). Set it whenever --host is not loopback.
    #[arg(long)]
    pub api_key: Option<String>,
    /// The model name of the OpenAI endpoints (default: the checkpoint directory's name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// A Jinja chat template for /v1/chat/completions (default: the tokenizer's
    /// `chat_template`, with the `huggingface` feature; else `role: content` lines).
    #[arg(long)]
    pub chat_template: Option<std::path::PathBuf>,
    /// Request bodies larger than this are answered 413.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    #[arg(long, default_value_t = 1234)]
    pub seed: u64,
    /// Do not print a line per request.
    #[arg(long)]
    pub quiet: bool,
    /// Ranks as threads of this process (= tensor x pipeline parallel size): rank 0 runs the
    /// continuous-batching engine, the others follow its model calls on their shards.
    #[arg(long, default_value_t = 1)]
    pub nproc: usize,
    #[arg(long, default_value_t = 1)]
    pub tensor_model_parallel_size: usize,
    #[arg(long, default_value_t = 1)]
    pub pipeline_model_parallel_size: usize,
    /// `auto` (MPI processes when `mpirun`/`srun` started this one, else threads), `mpi` or
    /// `local`; under MPI the world size is the launcher's process count (= T x P).
    #[arg(long, default_value = "auto", value_parser = ["auto", "mpi", "local"])]
    pub distributed_backend: String,
}

/// `123`, `64KiB`, `512MiB`, `2GiB` (also KB/MB/GB as powers of 1000).
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num.parse().map_err(|_| format!("`{s}` is not a size; use e.g. 512MiB"))?;
    let mul: usize = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        "KB" => 1000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        u => return Err(format!("unknown size unit `{u}` in `{s}`; use B, KiB, MiB or GiB")),
    };
    n.checked_mul(mul).ok_or_else(|| format!("`{s}` is too large"))
}

pub fn run(args: &ServeArgs, registry: &Registry) -> Result<()> {
    if crate::distributed::select_from_env(&args.distributed_backend, args.nproc)? == crate::distributed::Backend::Mpi {
        return run_mpi(args, registry);
    }
    let (loaded, followers) =
        if args.nproc == 1 && args.tensor_model_parallel_size * args.pipeline_model_parallel_size == 1 {
            (load_model(registry, &args.load)?, Vec::new())
        } else {
            ranks::load_ranks(
                registry,
                &args.load,
                args.nproc,
                args.tensor_model_parallel_size,
                args.pipeline_model_parallel_size,
            )?
        };
    serve_loaded(args, loaded, followers)?.join();
    Ok(())
}

/// `mpirun -np N megatron serve --tensor-model-parallel-size T --pipeline-model-parallel-size
/// P ...`: every process loads its shard; rank 0 serves HTTP and runs the engine, the others
/// follow its model calls until it stops. Rank 0 stops on SIGINT/SIGTERM (mpirun forwards them
/// to every process; the followers ignore the first one and stop when rank 0 tells them), so
/// every rank ends through MPI_Finalize with exit status 0. A rank that fails aborts the job.
fn run_mpi(args: &ServeArgs, registry: &Registry) -> Result<()> {
    let comm = ranks::mpi_world(registry)?; // held to the end: MPI_Finalize on this thread
    let stop = crate::signals::install()?;
    let (tp, pp) = (args.tensor_model_parallel_size, args.pipeline_model_parallel_size);
    ranks::run_mpi_rank(comm.as_ref(), || {
        let loaded = ranks::load_mpi_rank(registry, &args.load, comm.clone(), tp, pp)?;
        let (rank, n) = (comm.rank(), comm.world_size());
        if rank != 0 {
            println!("serving rank {rank} of {n} (pid {}) follows rank 0", std::process::id());
            let mut model = loaded.model;
            return megatron_serving::ranks::follow(&mut model);
        }
        println!("MPI world of {n} processes (tp {tp}, pp {pp}); rank 0 (pid {}) serves", std::process::id());
        let handle = serve_loaded(args, loaded, Vec::new())?;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        println!("rank 0: stopping the server and the {} other ranks", n - 1);
        handle.shutdown(); // the engine's last act tells the followers to stop
        Ok(())
    })
}

/// Starts the server on rank 0's `loaded` model (`followers`: the other ranks' shards when
/// they are threads of this process) and prints where it listens.
fn serve_loaded(
    args: &ServeArgs,
    loaded: crate::generate::LoadedModel,
    followers: Vec<megatron_gpt::GptModel>,
) -> Result<ServerHandle> {
    let mpi = followers.is_empty() && loaded.model.parallel_context().world_size() > 1;
    let api_key = args.api_key.clone().or_else(|| std::env::var("MEGATRON_API_KEY").ok()).filter(|k| !k.is_empty());
    let loopback = args.host == "localhost" || args.host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !loopback && api_key.is_none() {
        eprintln!("warning: serving on {} without --api-key: anyone who can reach it can use it", args.host);
    }
    let chat_template = chat_renderer(args, &loaded)?;
    let model_name = args.served_model_name.clone().unwrap_or_else(|| {
        let dir = args.load.load.canonicalize().unwrap_or_else(|_| args.load.load.clone());
        dir.file_name().map_or("megatron".into(), |n| n.to_string_lossy().into_owned())
    });
    let opts = ServeOptions {
        http_threads: args.http_threads,
        max_batch_prompts: args.max_batch_size,
        seed: args.seed,
        log: !args.quiet,
        batching: args.batching,
        engine: megatron_serving::EngineConfig {
            max_batch_size: args.max_batch_size,
            kv_cache_budget: args.kv_cache_budget,
            queue_limit: args.max_queue,
            slot_capacity: args.max_seq_len.unwrap_or(0),
            prefill_tokens: args.prefill_tokens,
        },
        api_key,
        model_name: model_name.clone(),
        chat_template,
        max_body_bytes: args.max_body_bytes,
    };
    let handle = if mpi {
        server::start_mpi_rank0(loaded, &args.host, args.port, opts)?
    } else {
        start_ranks(loaded, followers, &args.host, args.port, opts)?
    };
    let what = match args.batching {
        Batching::Continuous => {
            "PUT /api, POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health"
        }
        Batching::Static => "PUT /api, GET /health",
    };
    println!("serving {} as `{model_name}` on http://{} ({what})", args.load.load.display(), handle.addr());
    Ok(handle)
}

/// The chat template of `--chat-template` or the tokenizer config, if there is one.
fn chat_renderer(args: &ServeArgs, loaded: &crate::generate::LoadedModel) -> Result<Option<std::sync::Arc<ChatFn>>> {
    let template = match crate::generate::chat::find_template(args.chat_template.as_deref(), &loaded.args) {
        Ok(t) => t,
        Err(e) if args.chat_template.is_some() => return Err(e),
        Err(_) => return Ok(None), // no template: chats are `role: content` lines
    };
    if !cfg!(feature = "huggingface") {
        if args.chat_template.is_some() {
            anyhow::bail!(
                "--chat-template needs the `huggingface` feature (minijinja); rebuild with --features huggingface"
            );
        }
        return Ok(None);
    }
    let tok = loaded.tokenizer.clone();
    let special = tok.special_ids();
    let name = |id: Option<u32>| id.and_then(|i| tok.decode(&[i]).ok()).unwrap_or_default();
    let (bos, eos) = (name(special.bos), name(special.eos));
    // Checked once at start: a template that does not parse is an error now, not per request.
    crate::generate::chat::render_messages(
        &template,
        &[serde_json::json!({"role": "user", "content": "hi"})],
        &bos,
        &eos,
    )?;
    Ok(Some(std::sync::Arc::new(move |m: &[serde_json::Value]| {
        crate::generate::chat::render_messages(&template, m, &bos, &eos).map_err(|e| format!("{e:#}"))
    })))
}

/// A chat renderer shared by the HTTP threads.
pub type ChatFn = dyn Fn(&[serde_json::Value]) -> std::result::Result<String, String> + Send + Sync;
