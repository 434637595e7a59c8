//! Turning one input record into token sequences, exactly like `preprocess_data.py`'s
//! `Encoder.encode` (SPEC §1.10): for each key, the value (a string, or a list of strings =
//! pre-split sentences) is optionally sentence-split, each sentence tokenized, empty results
//! dropped, and the EOD id appended to a non-empty document (counted in its last sentence).
//! A document whose sentences are all empty has no sequences but still gets its boundary.

use super::input::{InputFormat, Record};
use super::sentences::split_sentences;
use megatron_core::Tokenizer;
use serde_json::Value;
use std::sync::Arc;

/// One key's document: the concatenated ids of its sequences and their lengths.
#[derive(Debug, Default, PartialEq)]
pub struct KeyDocument {
    pub tokens: Vec<u32>,
    pub lengths: Vec<usize>,
}

/// Why a record cannot be used; reported with the file and line number.
#[derive(Debug)]
pub struct BadLine {
    pub line: u64,
    pub reason: String,
}

/// What every worker needs to encode a record.
pub struct Encoder {
    pub tokenizer: Arc<dyn Tokenizer>,
    pub keys: Vec<String>,
    pub format: InputFormat,
    pub split_sentences: bool,
    pub keep_newlines: bool,
    /// `Some(eod)` with `--append-eod`.
    pub append_eod: Option<u32>,
    /// `Some((cls, sep))`: every tokenizer call (a document, or a sentence with
    /// --split-sentences) becomes `[CLS] ids [SEP]`, as current Megatron's Hugging Face based
    /// BERT tokenizers do unless `--tokenizer-hf-no-include-special-tokens`.
    pub wrap: Option<(u32, u32)>,
}

impl Encoder {
    /// The documents of `record`, one per key (in `keys` order).
    pub fn encode(&self, record: &Record) -> Result<Vec<KeyDocument>, BadLine> {
        let bad = |reason: String| BadLine { line: record.line, reason };
        let text = record.text.as_ref().map_err(|e| bad(e.clone()))?;
        if self.format != InputFormat::Jsonl {
            return Ok(vec![self.encode_sentences(&self.split(text)).map_err(bad)?]);
        }
        let json: Value = serde_json::from_str(text).map_err(|e| bad(format!("invalid JSON: {e}")))?;
        let Value::Object(obj) = json else {
            return Err(bad("expected a JSON object like {\"text\": \"...\"}".into()));
        };
        let mut docs = Vec::with_capacity(self.keys.len());
        for key in &self.keys {
            let doc = match obj.get(key) {
                None => return Err(bad(format!("the key \"{key}\" is missing (choose the keys with --json-keys)"))),
                Some(Value::String(s)) => self.encode_sentences(&self.split(s)),
                // A list is taken as sentences that are already split.
                Some(Value::Array(items)) => {
                    let mut sentences = Vec::with_capacity(items.len());
                    for (i, item) in items.iter().enumerate() {
                        match item {
                            Value::String(s) => sentences.push(s.as_str()),
                            other => {
                                return Err(bad(format!("\"{key}\"[{i}] is {}, expected a string", json_type(other))))
                            }
                        }
                    }
                    self.encode_sentences(&sentences)
                }
                Some(other) => {
                    return Err(bad(format!(
                        "the value of \"{key}\" is {}, expected a string or a list of strings",
                        json_type(other)
                    )))
                }
            };
            docs.push(doc.map_err(bad)?);
        }
        Ok(docs)
    }

    fn split<'a>(&self, text: &'a str) -> Vec<&'a str> {
        if self.split_sentences {
            split_sentences(text, self.keep_newlines)
        } else {
            vec![text]
        }
    }

    fn encode_sentences(&self, sentences: &[&str]) -> Result<KeyDocument, String> {
        let mut doc = KeyDocument::default();
        for sentence in sentences {
            let mut ids = self.tokenizer.encode(sentence).map_err(|e| format!("cannot tokenize the text: {e:#}"))?;
            if let Some((cls, sep)) = self.wrap {
                // Empty text too becomes `[CLS] [SEP]` (Hugging Face's `tokenizer("")`).
                ids.insert(0, cls);
                ids.push(sep);
            }
            if !ids.is_empty() {
                doc.lengths.push(ids.len());
                doc.tokens.extend_from_slice(&ids);
            }
        }
        if let (Some(eod), Some(last)) = (self.append_eod, doc.lengths.last_mut()) {
            doc.tokens.push(eod);
            *last += 1;
        }
        Ok(doc)
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use megatron_core::SpecialIds;

    /// Ids are the word lengths; "BAD" cannot be tokenized.
    struct WordLengths;

    impl Tokenizer for WordLengths {
        fn name(&self) -> &str {
            "word-lengths"
        }
        fn vocab_size(&self) -> usize {
            1000
        }
        fn encode(&self, text: &str) -> megatron_core::Result<Vec<u32>> {
            if text.contains("BAD") {
                anyhow::bail!("BAD is not allowed");
            }
            Ok(text.split_whitespace().map(|w| w.len() as u32).collect())
        }
        fn decode(&self, _ids: &[u32]) -> megatron_core::Result<String> {
            Ok(String::new())
        }
        fn special_ids(&self) -> SpecialIds {
            SpecialIds::default()
        }
        fn fingerprint(&self) -> String {
            "word-lengths".into()
        }
    }

    fn encoder(format: InputFormat, split: bool, keys: &[&str]) -> Encoder {
        Encoder {
            tokenizer: Arc::new(WordLengths),
            keys: keys.iter().map(|k| k.to_string()).collect(),
            format,
            split_sentences: split,
            keep_newlines: false,
            append_eod: Some(999),
            wrap: None,
        }
    }

    fn record(text: &str) -> Record {
        Record { line: 7, text: Ok(text.into()), bytes: text.len() as u64 }
    }

    fn doc(tokens: &[u32], lengths: &[usize]) -> KeyDocument {
        KeyDocument { tokens: tokens.to_vec(), lengths: lengths.to_vec() }
    }

    #[test]
    fn bert_wrapping_surrounds_every_tokenizer_call() {
        let mut e = encoder(InputFormat::Jsonl, true, &["text"]);
        e.wrap = Some((101, 102));
        e.append_eod = None;
        let docs = e.encode(&record(r#"{"text": ["ab c", "", "dd"]}"#)).ok();
        assert_eq!(docs, Some(vec![doc(&[101, 2, 1, 102, 101, 102, 101, 2, 102], &[4, 2, 3])]));
        e.split_sentences = false;
        let docs = e.encode(&record(r#"{"text": "ab c. Def"}"#)).ok();
        assert_eq!(docs, Some(vec![doc(&[101, 2, 2, 3, 102], &[5])]));
    }

    #[test]
    fn documents_sentences_and_eod_follow_preprocess_data() {
        let e = encoder(InputFormat::Jsonl, false, &["text", "t2"]);
        let docs = e.encode(&record(r#"{"text": "ab c. Def", "t2": ["x", "", "yy zzz"], "other": 1}"#)).ok();
        assert_eq!(docs, Some(vec![doc(&[2, 2, 3, 999], &[4]), doc(&[1, 2, 3, 999], &[1, 3])]));
        // Empty text: no sequences and no EOD (an empty document).
        assert_eq!(e.encode(&record(r#"{"text": " ", "t2": []}"#)).ok(), Some(vec![doc(&[], &[]), doc(&[], &[])]));

        let split = encoder(InputFormat::Jsonl, true, &["text"]);
        assert_eq!(split.encode(&record(r#"{"text": "ab cd. Ef"}"#)).ok(), Some(vec![doc(&[2, 3, 2, 999], &[2, 2])]));
        let lines = encoder(InputFormat::TextLines, false, &["text"]);
        assert_eq!(lines.encode(&record("{abc de")).ok(), Some(vec![doc(&[4, 2, 999], &[3])]));
    }

    #[test]
    fn bad_records_name_the_problem() {
        let e = encoder(InputFormat::Jsonl, false, &["text"]);
        let reason = |text: &str| e.encode(&record(text)).err().map(|b| (b.line, b.reason)).unwrap_or_default();
        assert!(reason("{\"text\": ").1.contains("invalid JSON"));
        assert!(reason("[1]").1.contains("expected a JSON object"));
        assert!(reason("{\"txt\": \"a\"}").1.contains("\"text\" is missing"));
        assert!(reason("{\"text\": null}").1.contains("is null"));
        assert!(reason("{\"text\": [\"a\", 2]}").1.contains("\"text\"[1] is a number"));
        assert_eq!(reason("{\"text\": \"BAD\"}"), (7, "cannot tokenize the text: BAD is not allowed".into()));
        let broken = Record { line: 3, text: Err("not UTF-8".into()), bytes: 1 };
        assert_eq!(e.encode(&broken).err().map(|b| (b.line, b.reason)), Some((3, "not UTF-8".into())));
    }
}
