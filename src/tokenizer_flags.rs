//! The tokenizer flags shared by `pretrain`, `preprocess` and `data inspect`
//! (`--vocab-file`, `--merge-file`, `--tokenizer-model`, `--vocab-size`, `--vocab-extra-ids`)
//! and the one place that turns them into a tokenizer plugin's config.

use serde_json::{json, Map, Value};
use std::path::PathBuf;

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
