//! Megatron-LM checkpoints for megatron-rs (SPEC §7.1–7.6).
//!
//! * [`pickle`] / [`torchzip`]: a safe reader of `torch.save` files (zip + pickle + raw
//!   storages) that builds tensors and plain containers and refuses every other object;
//! * [`legacy`]: Megatron-LM's legacy `torch` format (`iter_N/mp_rank_XX[_YYY]/model_optim_rng.pt`)
//!   read with all tensor/pipeline shards reassembled into full tensors; [`legacy_write`] writes it;
//! * [`optim_read`] / [`optim_write`]: the Adam state (moments, step, fp32 main params) of the
//!   legacy format, by Megatron's param-group numbering;
//! * [`dist`]: Megatron-Core's `torch_dist` format (`.metadata` + `__R_I.distcp`), model weights.

pub mod dist;
pub mod layout;
pub mod legacy;
pub mod legacy_write;
pub mod native;
pub mod optim_read;
pub mod optim_write;
pub mod partition;
pub mod pickle;
pub mod shape;
pub mod torchzip;
pub mod value;
pub mod writer;

pub use torchzip::{TensorData, TorchFile};
pub use value::{StorageRef, TensorRef, TorchDType, Value};

/// Checkpoint formats are not a registry plugin kind (the CLI calls this crate directly); the
/// registration record identifies the crate and version like every plugin crate.
fn plugins() -> Vec<megatron_core::Plugin> {
    Vec::new()
}

megatron_core::inventory::submit! {
    megatron_core::PluginCrate { crate_name: env!("CARGO_PKG_NAME"), version: env!("CARGO_PKG_VERSION"), plugins }
}
