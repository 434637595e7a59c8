//! Datasets (SPEC §1, §2): Megatron's indexed `.bin`/`.idx` format ([`indexed`]), the
//! `--split` arithmetic ([`split`]), blends ([`blend`], [`blended`]), the index cache
//! ([`cache`], [`npy`], named by [`md5`] of a [`pyjson`] description), the `gpt` dataset
//! plugin ([`gpt`], Megatron's `GPTDataset`) and the `mock` dataset plugin of random tokens
//! ([`mock`]). Registered through this crate's single `inventory` record.

pub mod bert;
pub mod blend;
pub mod blended;
pub mod cache;
pub mod gpt;
pub mod indexed;
pub mod md5;
pub mod mock;
pub mod npy;
pub mod pyjson;
pub mod split;
pub mod t5;

pub use blend::Blend;
pub use blended::{BlendSize, BlendedDataset};
pub use cache::CacheStatus;
pub use gpt::{build_gpt_splits, CachePolicy, GptBuilder, GptDataset, GptDatasetConfig, TokenizerDescription};
pub use indexed::{IndexedDataset, IndexedDatasetBuilder, TokenDType};
pub use mock::{build_mock_splits, MockDataset, MockDatasetConfig};

use megatron_core::registry::{parse_config, ConfigDe, DatasetEnv};
use megatron_core::{DatasetSplits, Factory, Plugin, Result};

fn build_gpt(de: ConfigDe, env: &DatasetEnv) -> Result<DatasetSplits> {
    let config: GptDatasetConfig = parse_config(de, gpt::plugin::NAME)?;
    build_gpt_splits(&config, env)
}

fn build_t5(de: ConfigDe, env: &DatasetEnv) -> Result<DatasetSplits> {
    let config: t5::plugin::T5PluginConfig = parse_config(de, t5::plugin::NAME)?;
    t5::plugin::build_t5_splits(&config, env.tokenizer.as_deref())
}

fn build_bert(de: ConfigDe, env: &DatasetEnv) -> Result<DatasetSplits> {
    let config: bert::plugin::BertPluginConfig = parse_config(de, bert::plugin::NAME)?;
    bert::plugin::build_bert_splits(&config, env.tokenizer.as_deref())
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
                "GPT samples from Megatron .bin/.idx prefixes, blended, cached (data_path, train/valid/test_data_path, \
                 split, seq_length, seed, num_samples, data_cache_path, mid_level_dataset_surplus, tokenizer)",
            factory: Factory::Dataset(build_gpt),
        },
        Plugin {
            name: t5::plugin::NAME,
            description: "T5 span-corruption samples (Megatron's T5MaskedWordPieceDataset) from a sentence-split prefix \
                          (data_path, split, vocab_file, vocab_extra_ids, encoder/decoder_seq_length, seed, num_samples)",
            factory: Factory::Dataset(build_t5),
        },
        Plugin {
            name: mock::NAME,
            description: "random token samples (seq_length, vocab_size, seed, num_samples)",
            factory: Factory::Dataset(build_mock),
        },
        Plugin {
            name: bert::plugin::NAME,
            description: "BERT masked-LM + sentence-order samples (Megatron's BERTMaskedWordPieceDataset) from a \
                          sentence-split prefix (data_path, split, vocab_file, seq_length, seed, mask_prob, \
                          short_seq_prob, binary_head, num_samples)",
            factory: Factory::Dataset(build_bert),
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
