//! `megatron serve`: Megatron's REST text-generation server (SPEC §8.1) — `PUT /api` and
//! `GET /health` — over a checkpoint. Loopback by default.

pub mod http;
pub mod request;
pub mod server;

use crate::generate::{load_model, LoadArgs};
use anyhow::Result;
use clap::Args;
use megatron_core::Registry;
pub use server::{start, ServeOptions, ServerHandle};

#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    #[arg(long, default_value_t = 5000)]
    pub port: u16,
    /// Address to bind; use 0.0.0.0 to accept remote clients (Megatron's default).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Threads parsing HTTP requests (generation itself runs on one model thread).
    #[arg(long, default_value_t = 16)]
    pub http_threads: usize,
    /// Most prompts batched together from concurrent requests (Megatron's
    /// --inference-max-requests).
    #[arg(long, alias = "inference-max-requests", default_value_t = 8)]
    pub max_batch_size: usize,
    #[arg(long, default_value_t = 1234)]
    pub seed: u64,
    /// Do not print a line per request.
    #[arg(long)]
    pub quiet: bool,
}

pub fn run(args: &ServeArgs, registry: &Registry) -> Result<()> {
    let loaded = load_model(registry, &args.load)?;
    let opts = ServeOptions {
        http_threads: args.http_threads,
        max_batch_prompts: args.max_batch_size,
        seed: args.seed,
        log: !args.quiet,
    };
    let handle = start(loaded, &args.host, args.port, opts)?;
    println!("serving {} on http://{} (PUT /api, GET /health)", args.load.load.display(), handle.addr());
    handle.join();
    Ok(())
}
