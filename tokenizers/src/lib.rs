//! Tokenizers (SPEC §3), registered under Megatron's `--tokenizer-type` names through this
//! crate's single `inventory` record:
//! - `GPT2BPETokenizer`: GPT-2 byte-level BPE from `vocab.json` + `merges.txt` ([`gpt2`]);
//! - `BertWordPieceLowerCase` / `BertWordPieceCase`: BERT WordPiece from `vocab.txt`
//!   ([`wordpiece`]);
//! - `HuggingFaceTokenizer` (feature `huggingface`): any `tokenizer.json` ([`huggingface`]);
//! - `NullTokenizer`: text is whitespace-separated ids ([`null`]).
//!
//! Also the byte-level BPE trainer behind `megatron tokenizer train` ([`bpe_train`]).

pub mod bert_basic;
pub mod bpe;
pub mod bpe_train;
mod bpe_train_files;
pub mod byte_unicode;
pub mod gpt2;
#[cfg(feature = "huggingface")]
pub mod huggingface;
pub mod null;
pub mod pretokenize;
pub mod unicode_class;
pub mod wordpiece;

mod fast_hash;
mod fingerprint;

pub use bpe_train::{train_byte_level_bpe, BpeTrainOptions, TrainedBpe};
pub use gpt2::{Gpt2BpeConfig, Gpt2BpeTokenizer};
#[cfg(feature = "huggingface")]
pub use huggingface::{HuggingFaceConfig, HuggingFaceTokenizer};
pub use null::{NullTokenizer, NullTokenizerConfig};
pub use wordpiece::{BertWordPieceConfig, BertWordPieceTokenizer};

use megatron_core::registry::{parse_config, ConfigDe};
use megatron_core::{Factory, Plugin, Result, Tokenizer};
use std::sync::Arc;

fn build_gpt2(de: ConfigDe) -> Result<Arc<dyn Tokenizer>> {
    let config: Gpt2BpeConfig = parse_config(de, gpt2::NAME)?;
    Ok(Arc::new(Gpt2BpeTokenizer::from_config(&config)?))
}

fn build_bert_lower(de: ConfigDe) -> Result<Arc<dyn Tokenizer>> {
    let config: BertWordPieceConfig = parse_config(de, wordpiece::NAME_LOWER)?;
    Ok(Arc::new(BertWordPieceTokenizer::from_config(&config, true)?))
}

fn build_bert_case(de: ConfigDe) -> Result<Arc<dyn Tokenizer>> {
    let config: BertWordPieceConfig = parse_config(de, wordpiece::NAME_CASE)?;
    Ok(Arc::new(BertWordPieceTokenizer::from_config(&config, false)?))
}

#[cfg(feature = "huggingface")]
fn build_huggingface(de: ConfigDe) -> Result<Arc<dyn Tokenizer>> {
    let config: HuggingFaceConfig = parse_config(de, huggingface::NAME)?;
    Ok(Arc::new(HuggingFaceTokenizer::from_config(&config)?))
}

fn build_null(de: ConfigDe) -> Result<Arc<dyn Tokenizer>> {
    let config: NullTokenizerConfig = parse_config(de, null::NAME)?;
    Ok(Arc::new(NullTokenizer::new(config.vocab_size)?))
}

/// Every plugin of this crate.
pub fn plugins() -> Vec<Plugin> {
    #[allow(unused_mut)] // only the `huggingface` feature adds to it
    let mut plugins = vec![
        Plugin {
            name: gpt2::NAME,
            description: "GPT-2 byte-level BPE (vocab_file = vocab.json, merge_file = merges.txt)",
            factory: Factory::Tokenizer(build_gpt2),
        },
        Plugin {
            name: wordpiece::NAME_LOWER,
            description: "BERT WordPiece, lower-cased and accents stripped (vocab_file = vocab.txt, vocab_extra_ids)",
            factory: Factory::Tokenizer(build_bert_lower),
        },
        Plugin {
            name: wordpiece::NAME_CASE,
            description: "BERT WordPiece, case kept (vocab_file = vocab.txt, vocab_extra_ids)",
            factory: Factory::Tokenizer(build_bert_case),
        },
        Plugin {
            name: null::NAME,
            description: "whitespace-separated integer ids; eod = vocab_size",
            factory: Factory::Tokenizer(build_null),
        },
    ];
    #[cfg(feature = "huggingface")]
    plugins.push(Plugin {
        name: huggingface::NAME,
        description: "Hugging Face tokenizer.json (tokenizer_model = path)",
        factory: Factory::Tokenizer(build_huggingface),
    });
    plugins
}

megatron_core::inventory::submit! {
    megatron_core::PluginCrate {
        crate_name: env!("CARGO_PKG_NAME"),
        version: env!("CARGO_PKG_VERSION"),
        plugins,
    }
}
