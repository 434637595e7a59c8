//! The `megatron` package: the command-line interface and the training driver of
//! megatron-rs. It links the plugin crates chosen by Cargo features; each is referenced
//! below so the linker keeps its `inventory` registration.

pub mod args;
pub mod bench;
pub mod bert_args;
#[cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]
pub mod checkpoint_tools;
pub mod cli;
pub mod config;
pub mod distributed;
#[cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]
pub mod eval_cli;
#[cfg(all(
    feature = "bert",
    feature = "gpt",
    feature = "checkpoint",
    feature = "tokenizers",
    feature = "datasets",
    feature = "optim"
))]
pub mod finetune_cli;
#[cfg(all(
    feature = "bert",
    feature = "gpt",
    feature = "checkpoint",
    feature = "tokenizers",
    feature = "datasets",
    feature = "optim"
))]
pub mod finetune_data;
#[cfg(all(
    feature = "bert",
    feature = "gpt",
    feature = "checkpoint",
    feature = "tokenizers",
    feature = "datasets",
    feature = "optim"
))]
pub mod finetune_dump;
#[cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]
pub mod generate;
#[cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]
pub mod hf;
pub mod hybrid_args;
pub mod llama_args;
pub mod moe_args;
#[cfg(all(feature = "gpt", feature = "optim", feature = "checkpoint"))]
pub mod plan_cli;
pub mod plugin_config;
pub mod plugins;
#[cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers"))]
pub mod serve;
pub mod signals;
pub mod t5_args;
pub mod tokenizer_flags;
pub mod tools;
pub mod virtual_pipeline_args;
// The training driver calls megatron-optim and megatron-checkpoint directly (the `minimal`
// build has neither: `megatron pretrain` then reports the features it needs).
#[cfg(all(feature = "optim", feature = "checkpoint"))]
pub mod train;

// Without a reference the linker drops a plugin crate and the registry is silently empty.
#[cfg(feature = "bert")]
use megatron_bert as _;
#[cfg(feature = "checkpoint")]
use megatron_checkpoint as _;
#[cfg(feature = "checkpoint")]
use megatron_checkpoint_megatron as _;
#[cfg(feature = "comm-local")]
use megatron_comm_local as _;
#[cfg(feature = "mpi")]
use megatron_comm_mpi as _;
#[cfg(feature = "cpu")]
use megatron_cpu as _;
#[cfg(feature = "datasets")]
use megatron_datasets as _;
#[cfg(feature = "example-mlp-lm")]
use megatron_example_mlp_lm as _;
#[cfg(feature = "gpt")]
use megatron_gpt as _;
#[cfg(feature = "hybrid")]
use megatron_hybrid as _;
#[cfg(feature = "metrics")]
use megatron_metrics as _;
#[cfg(feature = "moe")]
use megatron_moe as _;
#[cfg(feature = "optim")]
use megatron_optim as _;
#[cfg(feature = "parallel")]
use megatron_parallel as _;
#[cfg(feature = "t5")]
use megatron_t5 as _;
#[cfg(feature = "tokenizers")]
use megatron_tokenizers as _;
