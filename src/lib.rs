//! The `megatron` package: the command-line interface and the training driver of
//! megatron-rs. It links the plugin crates chosen by Cargo features; each is referenced
//! below so the linker keeps its `inventory` registration.

pub mod args;
pub mod bench;
pub mod cli;
pub mod config;
pub mod signals;
pub mod train;

// Without a reference the linker drops a plugin crate and the registry is silently empty.
#[cfg(feature = "checkpoint")]
use megatron_checkpoint as _;
#[cfg(feature = "cpu")]
use megatron_cpu as _;
#[cfg(feature = "datasets")]
use megatron_datasets as _;
#[cfg(feature = "gpt")]
use megatron_gpt as _;
#[cfg(feature = "metrics")]
use megatron_metrics as _;
#[cfg(feature = "optim")]
use megatron_optim as _;
#[cfg(feature = "parallel")]
use megatron_parallel as _;
#[cfg(feature = "tokenizers")]
use megatron_tokenizers as _;
