//! Native megatron-rs checkpoints: safetensors shards + JSON metadata, written atomically.
//!
//! Layout of a `--save` directory:
//! ```text
//! SAVE/latest_checkpointed_iteration.txt   the latest complete iteration, as text ("100")
//! SAVE/iter_0000100/metadata.json          run state + index of every tensor (global shape,
//!                                          dtype, and each stored slice: file, offset, shape)
//! SAVE/iter_0000100/model_tp00_pp000.safetensors   one per model-parallel rank (dp rank 0):
//!                                          parameters by name, optimizer state as
//!                                          `optimizer.{param}.{state}`
//! ```
//! Every tensor is stored as slices of its global shape, and optimizer moments per parameter,
//! so a checkpoint loads into any TP/PP/DP layout. A parameter made of TP blocks
//! (`ParamLayout::tp_chunks`, SwiGLU's `linear_fc1` = [gate; up]) is stored one slice per
//! block, under keys `{name}#{block}` (the shard's `key`), so its stored tensor is [gate; up]
//! at any TP size. (Checkpoints written before this at tp > 1 hold such tensors permuted: they
//! load right only at the TP size they were saved with.) [`save()`] is crash-safe (see
//! [`layout`]); [`load()`] validates everything it reads.
//!
//! Driver use: `save(dir, it, &params, Some(opt.state(b)?), meta, b, &ctx)`; on resume
//! `if let Some(_) = read_tracker(dir)? { let ck = load(dir, None)?; ck.load_params(..)?;
//! opt.load_state(ck.optimizer_state(..)?, ..)?; }` and restore the rest from `ck.metadata`.

pub mod layout;
pub mod load;
pub mod metadata;
pub mod region;
pub mod save;
mod sync;

pub use layout::{iteration_dir, list_iterations, read_tracker, shard_file_name, write_tracker, TRACKER_FILE};
pub use load::{load, LoadedCheckpoint};
pub use metadata::{
    CheckpointMeta, CheckpointMetadata, SavedParallel, ShardEntry, TensorEntry, FORMAT, FORMAT_VERSION,
};
pub use save::save;

/// Checkpoint formats are not a registry plugin kind (the driver calls this crate directly),
/// so the crate's one registration record lists no plugins; it still identifies the crate
/// and version to the registry like every plugin crate.
fn plugins() -> Vec<megatron_core::Plugin> {
    Vec::new()
}

megatron_core::inventory::submit! {
    megatron_core::PluginCrate { crate_name: env!("CARGO_PKG_NAME"), version: env!("CARGO_PKG_VERSION"), plugins }
}
