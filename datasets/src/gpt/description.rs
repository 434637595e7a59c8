//! The description of a `GPTDataset` (SPEC §2.5): the ordered dict `class, dataset_path,
//! num_samples, index_split, random_seed, sequence_length, split, split_matrix, tokenizer`,
//! dumped as Python's `json.dumps(indent=4)`; its md5 names the cache files, so identical
//! inputs give Megatron's file names.

use crate::md5::md5_hex;
use crate::pyjson::PyValue;
use crate::split::split_matrix_value;
use serde::{Deserialize, Serialize};

/// A Megatron tokenizer's `unique_identifiers`: `{"class", "tokenizer_path": [...], options...}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizerDescription {
    /// Megatron's class name, e.g. `_GPT2BPETokenizer`.
    pub class: String,
    /// The paths as given on the command line (`null` where Megatron passes `None`).
    #[serde(default)]
    pub tokenizer_path: Vec<Option<String>>,
    /// Keyword options in order, values as Python's `str(value)`.
    #[serde(default)]
    pub options: Vec<(String, String)>,
}

impl TokenizerDescription {
    /// What Megatron's legacy `build_tokenizer` records for `--tokenizer-type`; `None` for
    /// types without a known description.
    pub fn for_megatron_type(
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
                    ("lower_case".into(), if tokenizer_type.ends_with("LowerCase") { "True" } else { "False" }.into()),
                    ("vocab_extra_ids".into(), "0".into()),
                ],
            ),
            _ => return None,
        };
        Some(TokenizerDescription { class: class.into(), tokenizer_path, options })
    }

    pub fn to_value(&self) -> PyValue {
        let mut items = vec![
            ("class".to_string(), PyValue::str(&self.class)),
            (
                "tokenizer_path".to_string(),
                PyValue::List(self.tokenizer_path.iter().map(|p| PyValue::opt(p.clone(), PyValue::Str)).collect()),
            ),
        ];
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Text and md5 produced by CPython's `json.dumps(OrderedDict(...), indent=4)` and
    /// `hashlib.md5` for the same inputs (split matrix from `normalize([969, 30, 1])`).
    #[test]
    fn matches_pythons_json_and_md5() {
        let split = crate::split::parse_split("969, 30, 1").map(crate::split::split_bookends).ok();
        let tok = TokenizerDescription::for_megatron_type(
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
}
