//! Datasets (SPEC §1, §2): Megatron's indexed `.bin`/`.idx` format ([`indexed`]), the
//! `--split` arithmetic ([`split`]), the `gpt` dataset plugin ([`gpt`], Megatron's
//! `GPTDataset` over one prefix) and the `mock` dataset plugin of random tokens ([`mock`]).
//! Registered through this crate's single `inventory` record.

pub mod gpt;
pub mod indexed;
pub mod mock;
pub mod split;

pub use gpt::{build_gpt_splits, GptDataset, GptDatasetConfig};
pub use indexed::{IndexedDataset, IndexedDatasetBuilder, TokenDType};
pub use mock::{build_mock_splits, MockDataset, MockDatasetConfig};

use megatron_core::registry::{parse_config, ConfigDe, DatasetEnv};
use megatron_core::{DatasetSplits, Factory, Plugin, Result};

fn build_gpt(de: ConfigDe, env: &DatasetEnv) -> Result<DatasetSplits> {
    let config: GptDatasetConfig = parse_config(de, gpt::plugin::NAME)?;
    build_gpt_splits(&config, env)
}

fn build_mock(de: ConfigDe, _env: &DatasetEnv) -> Result<DatasetSplits> {
    let config: MockDatasetConfig = parse_config(de, mock::NAME)?;
    build_mock_splits(&config)
}

/// Every plugin of this crate.
pub fn plugins() -> Vec<Plugin> {
    vec![
        Plugin {
            name: gpt::plugin::NAME,
            description:
                "GPT samples from one Megatron .bin/.idx prefix (data_path, split, seq_length, seed, num_samples)",
            factory: Factory::Dataset(build_gpt),
        },
        Plugin {
            name: mock::NAME,
            description: "random token samples (seq_length, vocab_size, seed, num_samples)",
            factory: Factory::Dataset(build_mock),
        },
    ]
}

megatron_core::inventory::submit! {
    megatron_core::PluginCrate {
        crate_name: env!("CARGO_PKG_NAME"),
        version: env!("CARGO_PKG_VERSION"),
        plugins,
    }
}
