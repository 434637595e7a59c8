//! The tokenizer flags shared by `pretrain`, `preprocess` and `data inspect`, declared once
//! ([`TokenizerArgs`], flattened into each command's flags and, with `serde(flatten)`, into
//! the args a checkpoint stores, which therefore keep their flat keys), and the one place that
//! turns them into a tokenizer plugin's config ([`TokenizerFlags::config`]).

use clap::Args;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::path::PathBuf;

/// `--tokenizer-type`, `--vocab-file`, `--merge-file`, `--tokenizer-model`, `--vocab-size`,
/// `--vocab-extra-ids` (Megatron's names).
#[derive(Args, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenizerArgs {
    /// Registered tokenizer (`megatron list --kind tokenizer`).
    #[arg(long)]
    pub tokenizer_type: Option<String>,
    /// Vocabulary file (GPT-2 `vocab.json`, BERT `vocab.txt`).
    #[arg(long)]
    pub vocab_file: Option<PathBuf>,
    /// BPE merges (GPT-2 `merges.txt`).
    #[arg(long)]
    pub merge_file: Option<PathBuf>,
    /// Tokenizer model file (Hugging Face `tokenizer.json` of `--tokenizer-type HuggingFaceTokenizer`, ...).
    #[arg(long)]
    pub tokenizer_model: Option<PathBuf>,
    /// Vocabulary size of `NullTokenizer` (and of `--mock-data` without a tokenizer).
    #[arg(long)]
    pub vocab_size: Option<usize>,
    /// Extra `<extra_id_i>` tokens of the BERT WordPiece tokenizers.
    #[arg(long)]
    pub vocab_extra_ids: Option<usize>,
    /// Megatron's flag for its Hugging Face based tokenizers: text-to-ids without special
    /// tokens. `preprocess` then skips BERT's `[CLS] … [SEP]` wrap (current Megatron wraps by
    /// default; the legacy tool did not); in `pretrain` it only enters the dataset cache's
    /// tokenizer description, so the cache names match Megatron's.
    #[arg(long)]
    #[serde(default)]
    pub tokenizer_hf_no_include_special_tokens: bool,
}

impl TokenizerArgs {
    /// Every given flag as a [`TokenizerFlags`].
    pub fn flags(&self) -> TokenizerFlags<'_> {
        TokenizerFlags {
            vocab_file: self.vocab_file.as_ref(),
            merge_file: self.merge_file.as_ref(),
            tokenizer_model: self.tokenizer_model.as_ref(),
            vocab_size: self.vocab_size,
            vocab_extra_ids: self.vocab_extra_ids,
        }
    }
}

/// The tokenizer flags a command was given (`None`: not given).
#[derive(Clone, Copy, Debug, Default)]
pub struct TokenizerFlags<'a> {
    pub vocab_file: Option<&'a PathBuf>,
    pub merge_file: Option<&'a PathBuf>,
    pub tokenizer_model: Option<&'a PathBuf>,
    pub vocab_size: Option<usize>,
    pub vocab_extra_ids: Option<usize>,
}

impl TokenizerFlags<'_> {
    /// The plugin config: only the flags that were given, because each tokenizer plugin
    /// rejects fields it does not know (a flag meant for another tokenizer type is reported,
    /// not ignored).
    pub fn config(&self) -> Value {
        let mut m = Map::new();
        let paths = [
            ("vocab_file", self.vocab_file),
            ("merge_file", self.merge_file),
            ("tokenizer_model", self.tokenizer_model),
        ];
        for (name, value) in paths {
            if let Some(v) = value {
                m.insert(name.into(), json!(v));
            }
        }
        for (name, value) in [("vocab_size", self.vocab_size), ("vocab_extra_ids", self.vocab_extra_ids)] {
            if let Some(v) = value {
                m.insert(name.into(), json!(v));
            }
        }
        Value::Object(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_given_flags_become_fields() {
        let vocab = PathBuf::from("v.json");
        let flags = TokenizerFlags { vocab_file: Some(&vocab), vocab_extra_ids: Some(3), ..Default::default() };
        assert_eq!(flags.config(), json!({ "vocab_file": "v.json", "vocab_extra_ids": 3 }));
        assert_eq!(TokenizerFlags::default().config(), json!({}));
    }
}
