//! The description of a `GPTDataset` (SPEC §2.5): the ordered dict `class, dataset_path,
//! num_samples, index_split, random_seed, sequence_length, split, split_matrix, tokenizer`,
//! dumped as Python's `json.dumps(indent=4)`; its md5 names the cache files, so identical
//! inputs give Megatron's file names.

use crate::md5::md5_hex;
use crate::pyjson::PyValue;
use crate::split::split_matrix_value;
use serde::{Deserialize, Serialize};

/// A Megatron tokenizer's `unique_identifiers`: `{"class", "tokenizer_path", options...}`.
///
/// Two forms exist. Megatron-LM's current `build_tokenizer` (megatron.core.tokenizers) records
/// `class` = the module-qualified `MegatronTokenizerText`, `tokenizer_path` as one value (the
/// tokenizer type for the built-in ones, `null` for NullTokenizer) and every keyword argument
/// it passes as `str(value)`. The legacy `megatron.training.tokenizer` recorded `_GPT2BPETokenizer`
/// etc., a list of paths and fewer options. The current form names the cache files (so
/// Megatron reuses ours and we reuse its); `legacy` keeps the old form so caches written
/// under the old names are still found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizerDescription {
    /// Megatron's class name, e.g. `_GPT2BPETokenizer`.
    pub class: String,
    /// The paths as given on the command line (`null` where Megatron passes `None`).
    #[serde(default)]
    pub tokenizer_path: Vec<Option<String>>,
    /// Render `tokenizer_path` as its single value instead of a list (the current form).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub scalar_path: bool,
    /// Keyword options in order, values as Python's `str(value)`.
    #[serde(default)]
    pub options: Vec<(String, String)>,
    /// The legacy description of the same tokenizer, for finding caches named by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub legacy: Option<Box<TokenizerDescription>>,
}

/// Megatron's module-qualified class of every text tokenizer built by `build_tokenizer`.
const CURRENT_TEXT_CLASS: &str = "megatron.core.tokenizers.text.text_tokenizer.MegatronTokenizerText";

/// Python's `str(bool)`.
fn py_bool(b: bool) -> String {
    if b { "True" } else { "False" }.into()
}

impl TokenizerDescription {
    /// What Megatron-LM's current `build_tokenizer` records for `--tokenizer-type` with default
    /// flags (the legacy form in `legacy`); `None` for types without a known description.
    pub fn for_megatron_type(
        tokenizer_type: &str,
        vocab_file: Option<&str>,
        merge_file: Option<&str>,
        vocab_size: Option<usize>,
    ) -> Option<TokenizerDescription> {
        Self::for_megatron_type_with(tokenizer_type, vocab_file, merge_file, vocab_size, true)
    }

    /// As [`Self::for_megatron_type`], with `include_special_tokens` = not
    /// `--tokenizer-hf-no-include-special-tokens` (part of the current description).
    pub fn for_megatron_type_with(
        tokenizer_type: &str,
        vocab_file: Option<&str>,
        merge_file: Option<&str>,
        vocab_size: Option<usize>,
        include_special_tokens: bool,
    ) -> Option<TokenizerDescription> {
        let legacy = Self::legacy_for_megatron_type(tokenizer_type, vocab_file, merge_file, vocab_size)?;
        let py_path = |p: Option<&str>| p.unwrap_or("None").to_string();
        let (path, options): (Option<String>, Vec<(String, String)>) = match tokenizer_type {
            // NullTokenizer: kwargs vocab_size and pad_id (`--null-tokenizer-pad-id`, default -1).
            "NullTokenizer" => {
                (None, vec![("vocab_size".into(), vocab_size?.to_string()), ("pad_id".into(), "-1".into())])
            }
            _ => {
                let special = if tokenizer_type == "BertWordPieceCase" {
                    // Megatron adds T5's sentinel tokens for the cased BERT vocabulary.
                    let ids: Vec<String> = (0..100).map(|i| format!("'<extra_id_{i}>'")).collect();
                    format!("[{}]", ids.join(", "))
                } else {
                    "[]".into()
                };
                let options = vec![
                    ("additional_special_tokens".into(), special),
                    ("vocab_file".into(), py_path(vocab_file)),
                    ("merges_file".into(), py_path(merge_file)),
                    ("use_fast".into(), py_bool(true)),
                    ("trust_remote_code".into(), py_bool(false)),
                    ("include_special_tokens".into(), py_bool(include_special_tokens)),
                    ("use_gigatoken".into(), py_bool(false)),
                ];
                (Some(tokenizer_type.to_string()), options)
            }
        };
        Some(TokenizerDescription {
            class: CURRENT_TEXT_CLASS.into(),
            tokenizer_path: vec![path],
            scalar_path: true,
            options,
            legacy: Some(Box::new(legacy)),
        })
    }

    /// What Megatron's legacy `megatron.training.tokenizer.build_tokenizer` recorded.
    pub fn legacy_for_megatron_type(
        tokenizer_type: &str,
        vocab_file: Option<&str>,
        merge_file: Option<&str>,
        vocab_size: Option<usize>,
    ) -> Option<TokenizerDescription> {
        let path = |p: Option<&str>| p.map(str::to_string);
        let (class, tokenizer_path, options) = match tokenizer_type {
            "GPT2BPETokenizer" => ("_GPT2BPETokenizer", vec![path(vocab_file), path(merge_file)], vec![]),
            "NullTokenizer" => ("_NullTokenizer", vec![None], vec![("vocab_size".into(), vocab_size?.to_string())]),
            "BertWordPieceLowerCase" | "BertWordPieceCase" => (
                "_BertWordPieceTokenizer",
                vec![path(vocab_file)],
                vec![
                    ("lower_case".into(), py_bool(tokenizer_type.ends_with("LowerCase"))),
                    ("vocab_extra_ids".into(), "0".into()),
                ],
            ),
            _ => return None,
        };
        Some(TokenizerDescription { class: class.into(), tokenizer_path, options, ..Default::default() })
    }

    pub fn to_value(&self) -> PyValue {
        let path = if self.scalar_path && self.tokenizer_path.len() == 1 {
            PyValue::opt(self.tokenizer_path[0].clone(), PyValue::Str)
        } else {
            PyValue::List(self.tokenizer_path.iter().map(|p| PyValue::opt(p.clone(), PyValue::Str)).collect())
        };
        let mut items = vec![("class".to_string(), PyValue::str(&self.class)), ("tokenizer_path".to_string(), path)];
        items.extend(self.options.iter().map(|(k, v)| (k.clone(), PyValue::str(v))));
        PyValue::Dict(items)
    }
}

/// What identifies one split of one GPT dataset.
#[derive(Clone, Debug)]
pub struct GptDescription<'a> {
    pub dataset_path: &'a str,
    pub num_samples: Option<u64>,
    /// `train`, `valid` or `test`.
    pub index_split: &'a str,
    pub random_seed: u64,
    pub sequence_length: usize,
    /// The `--split` string as given (`None` with per-split data paths).
    pub split: Option<&'a str>,
    /// The split's bookends (`None` with per-split data paths).
    pub split_matrix: Option<[Option<(f64, f64)>; 3]>,
    pub tokenizer: Option<&'a TokenizerDescription>,
}

impl GptDescription<'_> {
    pub fn to_value(&self) -> PyValue {
        PyValue::dict([
            ("class", PyValue::str("GPTDataset")),
            ("dataset_path", PyValue::str(self.dataset_path)),
            ("num_samples", PyValue::opt(self.num_samples, |n| PyValue::Int(n as i64))),
            ("index_split", PyValue::str(self.index_split)),
            ("random_seed", PyValue::Int(self.random_seed as i64)),
            ("sequence_length", PyValue::Int(self.sequence_length as i64)),
            ("split", PyValue::opt(self.split, PyValue::str)),
            ("split_matrix", PyValue::opt(self.split_matrix.as_ref(), split_matrix_value)),
            ("tokenizer", PyValue::opt(self.tokenizer, TokenizerDescription::to_value)),
        ])
    }

    /// The JSON text and its md5.
    pub fn text_and_hash(&self) -> (String, String) {
        let text = self.to_value().dumps_indent4();
        let hash = md5_hex(text.as_bytes());
        (text, hash)
    }

    /// The same description with the tokenizer's legacy form, when it has one: caches named
    /// by it are still read.
    pub fn legacy(&self) -> Option<GptDescription<'_>> {
        let legacy = self.tokenizer?.legacy.as_deref()?;
        Some(GptDescription { tokenizer: Some(legacy), ..self.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Text and md5 produced by CPython's `json.dumps(OrderedDict(...), indent=4)` and
    /// `hashlib.md5` for the same inputs (split matrix from `normalize([969, 30, 1])`).
    #[test]
    fn matches_pythons_json_and_md5() {
        let split = crate::split::parse_split("969, 30, 1").map(crate::split::split_bookends).ok();
        let tok = TokenizerDescription::legacy_for_megatron_type(
            "GPT2BPETokenizer",
            Some("gpt2-vocab.json"),
            Some("gpt2-merges.txt"),
            None,
        );
        let d = GptDescription {
            dataset_path: "/t/D",
            num_samples: Some(30),
            index_split: "train",
            random_seed: 1234,
            sequence_length: 5,
            split: Some("969, 30, 1"),
            split_matrix: split,
            tokenizer: tok.as_ref(),
        };
        let (text, hash) = d.text_and_hash();
        assert!(text.starts_with("{\n    \"class\": \"GPTDataset\",\n    \"dataset_path\": \"/t/D\",\n"));
        assert_eq!(hash, "55954573d97fd271e42046faf9d79dc7");
    }

    /// Goldens from Megatron-LM's own code at its `main` (d98e8a6, 2026-08-22):
    /// `scripts/megatron_cache_golden.py` runs its `build_tokenizer` and `GPTDatasetConfig`
    /// and dumps the `GPTDataset` description as `MegatronDataset.__init__` does.
    #[test]
    fn current_form_matches_megatron_main() {
        let split = crate::split::parse_split("969, 30, 1").map(crate::split::split_bookends).ok();
        type Case<'a> = (&'a str, Option<&'a str>, Option<&'a str>, Option<usize>, bool, &'a str);
        let cases: [Case; 5] = [
            (
                "GPT2BPETokenizer",
                Some("gpt2-vocab.json"),
                Some("gpt2-merges.txt"),
                None,
                true,
                "80c12b30c7f922c7c5c9527ac72aed71",
            ),
            ("NullTokenizer", None, None, Some(100), true, "65bc1e14f19eb32f2f8f0b07ea1448f1"),
            ("BertWordPieceLowerCase", Some("vocab.txt"), None, None, true, "a1fd6db3378787f869f3af80dab035a8"),
            ("BertWordPieceCase", Some("vocab.txt"), None, None, true, "2a71b9c670642011f072952d4358bbb8"),
            ("BertWordPieceLowerCase", Some("vocab.txt"), None, None, false, "104fea093f89d544102f7086f53d1905"),
        ];
        for (ty, vocab, merges, vocab_size, special, want) in cases {
            let tok = TokenizerDescription::for_megatron_type_with(ty, vocab, merges, vocab_size, special);
            let d = GptDescription {
                dataset_path: "/t/D",
                num_samples: Some(30),
                index_split: "train",
                random_seed: 1234,
                sequence_length: 5,
                split: Some("969, 30, 1"),
                split_matrix: split,
                tokenizer: tok.as_ref(),
            };
            let (text, hash) = d.text_and_hash();
            assert_eq!(hash, want, "{ty} special={special}:\n{text}");
            // The legacy form is kept for lookups, and is the old golden for GPT-2.
            let legacy = d.legacy().unwrap().text_and_hash().1;
            if ty == "GPT2BPETokenizer" {
                assert_eq!(legacy, "55954573d97fd271e42046faf9d79dc7");
            }
            assert_ne!(legacy, hash);
        }
    }
}
