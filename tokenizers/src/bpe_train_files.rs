//! The files of byte-level BPE training: reading the training inputs (plain text or JSON
//! lines) into [`WordCounts`], and writing a [`TrainedBpe`] as GPT-2's `vocab.json` +
//! `merges.txt`, atomically.

use crate::bpe_train::{TrainedBpe, WordCounts};
use crate::byte_unicode::byte_to_char_table;
use anyhow::{bail, Context};
use megatron_core::Result;
use std::path::Path;

impl TrainedBpe {
    /// A token in GPT-2's byte-to-unicode spelling (special tokens are spelled as themselves).
    fn spelling(&self, id: u32, table: &[char; 256]) -> String {
        if self.special_ids.contains(&id) {
            return String::from_utf8_lossy(&self.tokens[id as usize]).into_owned();
        }
        self.tokens[id as usize].iter().map(|&b| table[b as usize]).collect()
    }

    /// `vocab.json`: `{"token": id, ...}` in id order.
    pub fn vocab_json(&self) -> String {
        let table = byte_to_char_table();
        let body: Vec<String> = (0..self.tokens.len() as u32)
            .map(|id| format!("{}: {id}", serde_json::Value::String(self.spelling(id, &table))))
            .collect();
        format!("{{{}}}", body.join(", "))
    }

    /// `merges.txt`: `#version: 0.2`, then `left right` per merge in rank order.
    pub fn merges_txt(&self) -> String {
        let table = byte_to_char_table();
        let mut out = String::from("#version: 0.2\n");
        for &(l, r) in &self.merges {
            out.push_str(&self.spelling(l, &table));
            out.push(' ');
            out.push_str(&self.spelling(r, &table));
            out.push('\n');
        }
        out
    }

    /// Writes `vocab.json` and `merges.txt` into `dir` (created if needed), each atomically
    /// (written to a temporary file, flushed, then renamed over the final name).
    pub fn write(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the output directory `{}`: check --output-dir", dir.display()))?;
        for (name, text) in [("merges.txt", self.merges_txt()), ("vocab.json", self.vocab_json())] {
            write_atomic(&dir.join(name), text.as_bytes())?;
        }
        Ok(())
    }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().with_context(|| {
        format!("cannot write `{}` (via `{}`): check the output directory", path.display(), tmp.display())
    })
}

/// Counts the pre-tokens of training files. A file is JSON lines (the string field `json_key`
/// of every non-empty line is a document) when `json_key` is given or its name ends in
/// `.jsonl` (key `text` by default); otherwise the whole file is one document.
pub fn count_files(
    paths: &[impl AsRef<Path>],
    json_key: Option<&str>,
    special_tokens: &[String],
) -> Result<WordCounts> {
    let mut counts = WordCounts::new(special_tokens);
    for path in paths {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read training input `{}` as UTF-8 text: check --input", path.display()))?;
        let is_jsonl = path.extension().is_some_and(|e| e == "jsonl");
        let key = match (json_key, is_jsonl) {
            (Some(k), _) => k,
            (None, true) => "text",
            (None, false) => {
                counts.add_text(&text);
                continue;
            }
        };
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let value: serde_json::Value = serde_json::from_str(line).with_context(|| {
                format!(
                    "`{}` line {}: not a JSON object; is this JSONL? (plain text needs no --json-key)",
                    path.display(),
                    n + 1
                )
            })?;
            let Some(doc) = value.get(key).and_then(|v| v.as_str()) else {
                bail!("`{}` line {}: no string field {key:?}; pass the right --json-key", path.display(), n + 1);
            };
            counts.add_text(doc);
        }
    }
    Ok(counts)
}
