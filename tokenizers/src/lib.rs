//! Tokenizers (SPEC §3): Megatron's `GPT2BPETokenizer` (GPT-2 byte-level BPE read from
//! `vocab.json` + `merges.txt`) and `NullTokenizer` (text is whitespace-separated ids).
//!
//! Both implement [`megatron_core::Tokenizer`] and are registered by their Megatron
//! `--tokenizer-type` names through this crate's single `inventory` record.

pub mod byte_unicode;
pub mod gpt2;
pub mod null;
pub mod pretokenize;

mod fingerprint;

pub use gpt2::{Gpt2BpeConfig, Gpt2BpeTokenizer};
pub use null::{NullTokenizer, NullTokenizerConfig};

use megatron_core::registry::{parse_config, ConfigDe};
use megatron_core::{Factory, Plugin, Result, Tokenizer};
use std::sync::Arc;

fn build_gpt2(de: ConfigDe) -> Result<Arc<dyn Tokenizer>> {
    let config: Gpt2BpeConfig = parse_config(de, gpt2::NAME)?;
    Ok(Arc::new(Gpt2BpeTokenizer::from_config(&config)?))
}

fn build_null(de: ConfigDe) -> Result<Arc<dyn Tokenizer>> {
    let config: NullTokenizerConfig = parse_config(de, null::NAME)?;
    Ok(Arc::new(NullTokenizer::new(config.vocab_size)?))
}

/// Every plugin of this crate.
pub fn plugins() -> Vec<Plugin> {
    vec![
        Plugin {
            name: gpt2::NAME,
            description: "GPT-2 byte-level BPE (vocab_file = vocab.json, merge_file = merges.txt)",
            factory: Factory::Tokenizer(build_gpt2),
        },
        Plugin {
            name: null::NAME,
            description: "whitespace-separated integer ids; eod = vocab_size",
            factory: Factory::Tokenizer(build_null),
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
