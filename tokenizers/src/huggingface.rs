//! Megatron's `HuggingFaceTokenizer` (SPEC §3.1) for local files: a Hugging Face
//! `tokenizer.json` run by the `tokenizers` crate (feature `huggingface`). Hub names need the
//! network and are not supported: download the files and pass the path.
//!
//! Like Megatron (which calls `AutoTokenizer(text).input_ids`), `encode` adds the tokenizer's
//! own special tokens (BOS, `[CLS] … [SEP]`, …) unless `add_special_tokens` is false; `decode`
//! keeps special tokens. Special ids: from `tokenizer_config.json` beside `tokenizer.json`
//! (`bos_token`, `eos_token`, …, as `AutoTokenizer` reads them) when it exists, otherwise from
//! well-known added tokens (`</s>`, `<|endoftext|>`, `<s>`, `[PAD]`, …). `eod = eos`.

use crate::fingerprint::fnv1a64;
use anyhow::{anyhow, Context};
use megatron_core::{Result, SpecialIds, Tokenizer};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The `--tokenizer-type` name.
pub const NAME: &str = "HuggingFaceTokenizer";

fn default_true() -> bool {
    true
}

/// Config of the `HuggingFaceTokenizer` plugin (Megatron's `--tokenizer-model`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HuggingFaceConfig {
    /// `tokenizer.json`, or a directory holding it.
    pub tokenizer_model: PathBuf,
    /// Whether `encode` adds the post-processor's special tokens (default true, like Megatron).
    #[serde(default = "default_true")]
    pub add_special_tokens: bool,
}

/// A `tokenizer.json` tokenizer.
pub struct HuggingFaceTokenizer {
    inner: tokenizers::Tokenizer,
    add_special_tokens: bool,
    special: SpecialIds,
    fingerprint: String,
}

/// Well-known spellings of each special token, tried in order among the added tokens.
const KNOWN: [(&str, &[&str]); 7] = [
    ("eos_token", &["</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "[EOS]"]),
    ("bos_token", &["<s>", "<|begin_of_text|>", "<bos>", "[BOS]"]),
    ("pad_token", &["<pad>", "[PAD]", "<|pad|>"]),
    ("cls_token", &["[CLS]", "<cls>"]),
    ("sep_token", &["[SEP]", "<sep>"]),
    ("mask_token", &["[MASK]", "<mask>"]),
    ("unk_token", &["<unk>", "[UNK]"]),
];

impl HuggingFaceTokenizer {
    pub fn from_config(config: &HuggingFaceConfig) -> Result<Self> {
        let path = if config.tokenizer_model.is_dir() {
            config.tokenizer_model.join("tokenizer.json")
        } else {
            config.tokenizer_model.clone()
        };
        let bytes = std::fs::read(&path).with_context(|| {
            format!("cannot read the Hugging Face tokenizer `{}`: check --tokenizer-model (a tokenizer.json or its directory; hub names are not supported)", path.display())
        })?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
            anyhow!("`{}` is not a Hugging Face tokenizer.json ({e}); check --tokenizer-model", path.display())
        })?;
        let config_file = path.with_file_name("tokenizer_config.json");
        let named = read_tokenizer_config(&config_file)?;
        let added: Vec<String> = inner.get_added_tokens_decoder().into_values().map(|t| t.content).collect();
        let find = |key: &str, known: &[&str]| -> Option<u32> {
            if let Some(tok) = named.as_ref().and_then(|n| token_name(n.get(key)?)) {
                return inner.token_to_id(&tok);
            }
            known.iter().filter(|k| added.iter().any(|a| a == *k)).find_map(|k| inner.token_to_id(k))
        };
        let ids: Vec<Option<u32>> = KNOWN.iter().map(|(key, known)| find(key, known)).collect();
        let special =
            SpecialIds { eod: ids[0], eos: ids[0], bos: ids[1], pad: ids[2], cls: ids[3], sep: ids[4], mask: ids[5] };
        let fingerprint = format!("{NAME}:tokenizer-fnv1a64={:016x}", fnv1a64(&bytes));
        Ok(HuggingFaceTokenizer { inner, add_special_tokens: config.add_special_tokens, special, fingerprint })
    }
}

/// `tokenizer_config.json`, if present.
fn read_tokenizer_config(path: &Path) -> Result<Option<serde_json::Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read `{}`", path.display()))?;
    let value = serde_json::from_str(&text)
        .with_context(|| format!("`{}` is not valid JSON; fix or remove it", path.display()))?;
    Ok(Some(value))
}

/// A special token in `tokenizer_config.json`: a string or `{"content": "..."}`.
fn token_name(v: &serde_json::Value) -> Option<String> {
    v.as_str().or_else(|| v.get("content")?.as_str()).map(str::to_string)
}

impl Tokenizer for HuggingFaceTokenizer {
    fn name(&self) -> &str {
        NAME
    }

    fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, self.add_special_tokens)
            .map_err(|e| anyhow!("Hugging Face tokenizer failed to encode {} bytes of text: {e}", text.len()))?;
        Ok(enc.get_ids().to_vec())
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        // `tokenizers` silently skips unknown ids; report them instead.
        let n = self.vocab_size();
        if let Some((pos, id)) = ids.iter().enumerate().find(|&(_, &id)| id as usize >= n) {
            return Err(anyhow!("cannot decode id {id} at position {pos}: the tokenizer has {n} ids"));
        }
        self.inner
            .decode(ids, false)
            .map_err(|e| anyhow!("Hugging Face tokenizer failed to decode {} ids: {e}", ids.len()))
    }

    fn special_ids(&self) -> SpecialIds {
        self.special
    }

    fn fingerprint(&self) -> String {
        self.fingerprint.clone()
    }
}
