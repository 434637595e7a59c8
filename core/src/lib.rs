//! `megatron-core`: the minimal core of megatron-rs.
//!
//! It owns the traits every plugin implements ([`Backend`], [`Communicator`],
//! [`ParallelStrategy`], [`Model`], [`Schedule`], [`Optimizer`], [`LrSchedule`], [`Dataset`],
//! [`Tokenizer`], [`MetricsSink`]), the small types they share ([`DeviceTensor`], [`DType`],
//! [`ParallelContext`], [`Batch`], [`Param`]) and the plugin [`registry`]. It depends on no
//! other workspace crate; everything else is a plugin registered by name.

pub mod attention_block;
pub mod backend;
pub mod comm;
pub mod cross_attention;
pub mod data;
pub mod dtype;
#[cfg(target_os = "linux")]
pub mod elf_check;
pub mod forward_pre_hook;
pub mod gqa;
pub mod grouped_gemm;
pub mod guarded_model;
pub mod half_parity;
pub mod mamba_ops;
pub mod metrics;
pub mod mlp_slot;
pub mod model;
pub mod model_chunks;
pub mod model_wrapper;
pub mod optim;
pub mod padded_attention;
pub mod parallel;
pub mod plugin_export;
pub mod plugin_loader;
pub mod recording_model;
pub mod registry;
pub mod rope_scaling;
pub mod schedule;
pub mod tensor;

pub use attention_block::AttentionBlockSpec;
pub use backend::{
    copy_any, ActivationOps, AdamStep, AttentionOps, AttentionSpec, Backend, ElementwiseOps, EmbeddingLossOps, GemmOps,
    GemmSpec, KvCacheAttentionSpec, KvCacheOps, MambaOps, MemoryOps, NormOps, OptimizerOps, PaddedAttentionOps,
    RingAttentionOps, RotaryOps, RotarySpec,
};
pub use comm::{Communicator, Group, ReduceOp, SingleRankCommunicator};
pub use cross_attention::CrossAttentionSpec;
pub use data::{Dataset, DatasetSplits, Sample, SpecialIds, Tokenizer};
pub use dtype::DType;
pub use forward_pre_hook::{run_forward_pre_hook, ForwardPreHook, SharedForwardPreHook};
pub use gqa::GqaSpec;
pub use grouped_gemm::{GemmGroup, GroupedGemmSpec};
pub use mamba_ops::{Conv1dSpec, SsdGradTensors, SsdSpec, SsdTensors};
pub use metrics::MetricsSink;
pub use mlp_slot::{MlpEnv, MlpModule, MlpProvider, MlpStep};
pub use model::{Batch, GradsReadyHook, LossReport, Mode, Model, Param, ParamLayout, StageOutput};
pub use model_chunks::ModelChunks;
pub use model_wrapper::ModelWrapper;
pub use optim::{LrSchedule, Optimizer, OptimizerState};
pub use padded_attention::PaddedAttentionSpec;
pub use parallel::{GradSync, ParallelContext, ParallelStrategy, RankGrid};
pub use registry::{Factory, Plugin, PluginCrate, PluginKind, Registry};
pub use rope_scaling::RopeScaling;
pub use schedule::Schedule;
pub use tensor::{DeviceStorage, DeviceTensor, HostBuffer, Storage};

/// Errors are `anyhow` errors carrying context that names the file, field or flag at fault.
pub type Result<T> = anyhow::Result<T>;

/// Re-exported so plugin crates use the same versions as the core.
pub use anyhow;
pub use erased_serde;
pub use half;
pub use inventory;
pub use serde_json;

/// The megatron-core version (one field of the build tag dynamic plugins must match).
pub const CORE_VERSION: &str = env!("CARGO_PKG_VERSION");
