//! Hugging Face GPT-2 interchange (SPEC §7.7): `megatron export hf` ([`export`]) and
//! `megatron import hf` ([`import`]). The tensor name map and layouts live in
//! `megatron_gpt::hf_gpt2`; this module handles checkpoints, configs and files.

#[cfg(feature = "bert")]
pub mod bert;
pub mod export;
pub(crate) mod files;
pub mod gguf;
pub mod import;
pub mod import_llama;
pub mod import_mixtral;
#[cfg(feature = "hybrid")]
pub mod mamba2;
#[cfg(feature = "t5")]
pub mod t5;

use clap::Subcommand;

/// `megatron export <format>`.
#[derive(Subcommand, Debug)]
pub enum ExportCommand {
    /// A checkpoint to a Hugging Face GPT2LMHeadModel directory.
    Hf(export::ExportHfArgs),
}

/// `megatron import <format>`.
#[derive(Subcommand, Debug)]
pub enum ImportCommand {
    /// A Hugging Face GPT-2 directory to a checkpoint (iteration 0).
    Hf(import::ImportHfArgs),
    /// A llama.cpp GGUF file (llama, mistral, qwen2) to a checkpoint with its tokenizer.
    Gguf(gguf::ImportGgufArgs),
}
