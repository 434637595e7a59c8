//! The `gpt` dataset plugin: Megatron's `GPTDataset` (SPEC §2.6) over `.bin`/`.idx` prefixes,
//! split by `--split` at the sequence level or given per split, blended by
//! [`crate::blended`] (SPEC §2.4), with the index cache of SPEC §2.5 ([`cached`],
//! [`description`]). Not supported yet: reset_position_ids, reset_attention_mask and
//! eod_mask_loss.

pub mod builder;
pub mod cached;
pub mod dataset;
pub mod description;
pub mod indices;
pub mod plugin;
pub mod random_state;

pub use builder::{CachePolicy, GptBuilder};
pub use dataset::{GptDataset, GptSplitConfig};
pub use description::{GptDescription, TokenizerDescription};
pub use indices::{build_indices, epoch_plan, EpochPlan, GptIndices, IndexSpec};
pub use plugin::{build_gpt_splits, GptDatasetConfig};
pub use random_state::RandomState;
