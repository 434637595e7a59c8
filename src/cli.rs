//! Command-line entry: `megatron pretrain | list | bench`.

use crate::args::PretrainArgs;
use crate::config::TrainConfig;
use anyhow::Result;
use clap::{Parser, Subcommand};
use megatron_core::{PluginKind, Registry};
#[cfg(all(feature = "optim", feature = "checkpoint"))]
use std::sync::{atomic::AtomicBool, Arc};

/// Parsed as Megatron's argparse parses: a repeated flag keeps its last value (scripts append
/// overrides) and a value may be a negative number (`--lr -1` reaches the range check).
#[derive(Parser, Debug)]
#[command(name = "megatron", version, about = "Megatron-LM in Rust: pretrain transformer language models")]
#[command(args_override_self = true, mut_subcommands = accept_negative_numbers, mut_args = negative_values)]
pub struct Cli {
    /// Load a plugin library (a cdylib built with `megatron_core::export_plugin!`) before the
    /// registry is used; repeatable. See docs/plugins.md.
    #[arg(long = "plugin", global = true, value_name = "PATH")]
    pub plugins: Vec<std::path::PathBuf>,
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
    /// Generate text from a checkpoint (streams tokens for a single --prompt).
    #[cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]
    Generate(Box<crate::generate::cli::GenerateArgs>),
    /// Megatron's REST text-generation server (PUT /api, GET /health).
    #[cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]
    Serve(Box<crate::serve::ServeArgs>),
    /// Export a checkpoint to another format (`hf`: Hugging Face GPT-2).
    #[cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]
    #[command(subcommand)]
    Export(crate::hf::ExportCommand),
    /// Import a checkpoint from another format (`hf`: Hugging Face GPT-2).
    #[cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]
    #[command(subcommand)]
    Import(crate::hf::ImportCommand),
    /// Tokenize a corpus into Megatron .bin/.idx datasets (tools/preprocess_data.py), or --merge datasets.
    #[cfg(feature = "datasets")]
    Preprocess(Box<crate::tools::preprocess::PreprocessArgs>),
    /// Inspect indexed datasets (`megatron data inspect PREFIX`).
    #[cfg(feature = "datasets")]
    Data {
        #[command(subcommand)]
        command: crate::tools::data_inspect::DataCommand,
    },
    /// Tokenizer tools (`megatron tokenizer train`: byte-level BPE → vocab.json + merges.txt).
    #[cfg(feature = "tokenizers")]
    Tokenizer {
        #[command(subcommand)]
        command: crate::tools::tokenizer_train::TokenizerCommand,
    },
    /// Checkpoint tools: `convert` (Megatron-LM legacy <-> native <-> hf), `inspect`.
    #[cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]
    Checkpoint {
        #[command(subcommand)]
        command: crate::checkpoint_tools::CheckpointCommand,
    },
    /// Zero-shot evaluation of a checkpoint (tasks/main.py: WIKITEXT103 perplexity, LAMBADA accuracy).
    #[cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]
    Eval(Box<crate::eval_cli::EvalArgs>),
    /// Memory, FLOPs and step time of a `pretrain` layout, nothing allocated (megatron-plan).
    #[cfg(all(feature = "gpt", feature = "optim", feature = "checkpoint"))]
    Plan(Box<crate::plan_cli::PlanArgs>),
    /// Finetune a BERT checkpoint on a GLUE classification task (tasks/main.py: MNLI, QQP; MRPC, RTE).
    #[cfg(all(
        feature = "bert",
        feature = "gpt",
        feature = "checkpoint",
        feature = "tokenizers",
        feature = "datasets",
        feature = "optim"
    ))]
    Finetune(Box<crate::finetune_cli::FinetuneArgs>),
}

/// Lets every value-taking flag of `cmd` and of its subcommands (recursively) take a negative
/// number as its value, as argparse does.
fn accept_negative_numbers(cmd: clap::Command) -> clap::Command {
    cmd.mut_args(negative_values).mut_subcommands(accept_negative_numbers)
}

fn negative_values(arg: clap::Arg) -> clap::Arg {
    // Flags without a value (`--swiglu`) and positionals keep clap's defaults.
    let takes_value = arg.get_action().takes_values() && arg.get_num_args().is_none_or(|n| n.takes_values());
    if takes_value && !arg.is_positional() {
        arg.allow_negative_numbers(true)
    } else {
        arg
    }
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
    let registry = crate::plugins::registry_with_plugins(&cli.plugins)?;
    match cli.command {
        Command::Pretrain(args) => run_pretrain(&args, &registry),
        Command::List { kind } => list(&registry, kind.as_deref()),
        Command::Bench(args) => crate::bench::run(&args, &registry),
        #[cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]
        Command::Generate(args) => crate::generate::cli::run(&args, &registry),
        #[cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]
        Command::Serve(args) => crate::serve::run(&args, &registry),
        #[cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]
        Command::Export(crate::hf::ExportCommand::Hf(args)) => crate::hf::export::run(&args, &registry),
        #[cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]
        Command::Import(crate::hf::ImportCommand::Hf(args)) => crate::hf::import::run(&args, &registry).map(|_| ()),
        #[cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]
        Command::Import(crate::hf::ImportCommand::Gguf(args)) => crate::hf::gguf::run(&args, &registry).map(|_| ()),
        #[cfg(feature = "datasets")]
        Command::Preprocess(args) => crate::tools::preprocess::run(&args, &registry).map(|_| ()),
        #[cfg(feature = "datasets")]
        Command::Data { command } => crate::tools::data_inspect::run(&command, &registry),
        #[cfg(feature = "tokenizers")]
        Command::Tokenizer { command } => crate::tools::tokenizer_train::run(&command),
        #[cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]
        Command::Checkpoint { command } => crate::checkpoint_tools::run(&command, &registry),
        #[cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]
        Command::Eval(args) => crate::eval_cli::run(&args, &registry),
        #[cfg(all(feature = "gpt", feature = "optim", feature = "checkpoint"))]
        Command::Plan(args) => crate::plan_cli::run(&args, &registry),
        #[cfg(all(
            feature = "bert",
            feature = "gpt",
            feature = "checkpoint",
            feature = "tokenizers",
            feature = "datasets",
            feature = "optim"
        ))]
        Command::Finetune(args) => crate::finetune_cli::run(&args, &registry),
    }
}

#[cfg(all(feature = "optim", feature = "checkpoint"))]
fn run_pretrain(args: &PretrainArgs, registry: &Registry) -> Result<()> {
    let stop = crate::signals::install()?;
    let summary = pretrain(args, registry, stop)?;
    if summary.stopped_by_signal {
        println!("stopped by signal after iteration {}", summary.final_iteration);
    }
    Ok(())
}

/// A build without the training driver's crates (e.g. `--features minimal`).
#[cfg(not(all(feature = "optim", feature = "checkpoint")))]
fn run_pretrain(args: &PretrainArgs, _registry: &Registry) -> Result<()> {
    TrainConfig::from_args(args, 1)?; // flag errors first, as in the full build
    anyhow::bail!(crate::plugins::missing_pretrain_features().unwrap_or_default())
}

/// Builds the trainer and trains; `stop` is the flag a signal handler sets. `args.config`
/// (`--config FILE`) is applied first (src/plugin_config.rs).
#[cfg(all(feature = "optim", feature = "checkpoint"))]
pub fn pretrain(args: &PretrainArgs, registry: &Registry, stop: Arc<AtomicBool>) -> Result<crate::train::TrainSummary> {
    let (args, registry) = crate::plugin_config::apply_config_file(args, registry)?;
    match crate::distributed::select_from_env(&args.distributed_backend, args.nproc)? {
        crate::distributed::Backend::Mpi => crate::train::run_mpi_rank(&args, &registry, stop),
        crate::distributed::Backend::Local => {
            let cfg = TrainConfig::from_args(&args, args.nproc)?;
            let summary = crate::train::run_ranks(cfg.clone(), &registry, stop)?;
            // The planner's prediction next to what this process really peaked at (issue 19).
            if let Some(line) = crate::plan_cli::peak_report(&cfg, &registry) {
                println!("{line}");
            }
            Ok(summary)
        }
    }
}

fn list(registry: &Registry, kind: Option<&str>) -> Result<()> {
    let kind = kind.map(PluginKind::parse).transpose()?;
    println!("{:<18} {:<22} {:<9} {:<24} origin", "kind", "name", "version", "crate");
    for e in registry.entries() {
        let k = e.plugin.factory.kind();
        if kind.is_some_and(|want| want != k) {
            continue;
        }
        println!("{:<18} {:<22} {:<9} {:<24} {}", k.as_str(), e.plugin.name, e.version, e.crate_name, e.origin);
    }
    Ok(())
}
