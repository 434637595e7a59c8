//! The `gpt` dataset plugin: Megatron's `GPTDataset` over one `.bin`/`.idx` prefix, split by
//! `--split` at the sequence level (SPEC §2.2, §2.6). Blends of several prefixes are not
//! supported yet. Not supported either: the on-disk index cache (indices are rebuilt at
//! start-up: about 1.5 s for 1M samples of 1024 tokens over tiny Shakespeare, 3206 epochs),
//! reset_position_ids, reset_attention_mask and eod_mask_loss.

pub mod dataset;
pub mod indices;
pub mod plugin;
pub mod random_state;

pub use dataset::{GptDataset, GptSplitConfig};
pub use indices::{build_indices, GptIndices, IndexSpec};
pub use plugin::{build_gpt_splits, GptDatasetConfig};
pub use random_state::RandomState;
