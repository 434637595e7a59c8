//! Command-line entry: `megatron pretrain | list | bench`.

use crate::args::PretrainArgs;
use crate::config::TrainConfig;
use anyhow::Result;
use clap::{Parser, Subcommand};
use megatron_core::{PluginKind, Registry};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

#[derive(Parser, Debug)]
#[command(name = "megatron", version, about = "Megatron-LM in Rust: pretrain transformer language models")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Pretrain a model (Megatron-LM's pretrain_gpt.py flags).
    Pretrain(Box<PretrainArgs>),
    /// Print the registered plugins.
    List {
        /// Only this kind (backend, communicator, parallel-strategy, model, schedule,
        /// optimizer, lr-schedule, dataset, tokenizer, metrics).
        #[arg(long)]
        kind: Option<String>,
    },
    /// Measure training throughput against the backend's GEMM rate.
    Bench(crate::bench::BenchArgs),
}

/// Runs the CLI; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}

pub fn run(cli: Cli) -> Result<()> {
    let registry = Registry::builtin()?;
    match cli.command {
        Command::Pretrain(args) => {
            let stop = crate::signals::install()?;
            let summary = pretrain(&args, &registry, stop)?;
            if summary.stopped_by_signal {
                println!("stopped by signal after iteration {}", summary.final_iteration);
            }
            Ok(())
        }
        Command::List { kind } => list(&registry, kind.as_deref()),
        Command::Bench(args) => crate::bench::run(&args, &registry),
    }
}

/// Builds the trainer and trains; `stop` is the flag a signal handler sets.
pub fn pretrain(args: &PretrainArgs, registry: &Registry, stop: Arc<AtomicBool>) -> Result<crate::train::TrainSummary> {
    let cfg = TrainConfig::from_args(args, 1)?;
    let mut trainer = crate::train::build_trainer(cfg, registry, stop)?;
    trainer.train()
}

fn list(registry: &Registry, kind: Option<&str>) -> Result<()> {
    let kind = kind.map(PluginKind::parse).transpose()?;
    println!("{:<18} {:<22} {:<9} {:<22} origin", "kind", "name", "version", "crate");
    for e in registry.entries() {
        let k = e.plugin.factory.kind();
        if kind.is_some_and(|want| want != k) {
            continue;
        }
        println!("{:<18} {:<22} {:<9} {:<22} {}", k.as_str(), e.plugin.name, e.version, e.crate_name, e.origin);
    }
    Ok(())
}
