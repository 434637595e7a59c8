//! Megatron's `GPT2BPETokenizer`: GPT-2 byte-level BPE over OpenAI's `encoder.json`
//! (`vocab.json`) and `vocab.bpe` (`merges.txt`). `encode` is GPT-2's ordinary encoding (a
//! literal `<|endoftext|>` in text is tokenized as text, like Megatron's `tokenize`);
//! [`Gpt2BpeTokenizer::encode_with_special`] maps it to the eod id instead.

use crate::bpe::BytePairModel;
use crate::byte_unicode::{byte_to_char_table, char_to_byte_table};
use crate::fingerprint::fnv1a64;
use crate::pretokenize;
use anyhow::{anyhow, bail, Context};
use megatron_core::{Result, SpecialIds, Tokenizer};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The `--tokenizer-type` name.
pub const NAME: &str = "GPT2BPETokenizer";
/// GPT-2's end-of-document token.
pub const EOD_TOKEN: &str = "<|endoftext|>";

/// Config of the `GPT2BPETokenizer` plugin (Megatron's `--vocab-file`, `--merge-file`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpt2BpeConfig {
    pub vocab_file: PathBuf,
    pub merge_file: PathBuf,
}

/// GPT-2 byte-level BPE tokenizer.
pub struct Gpt2BpeTokenizer {
    /// Token string (byte-mapped chars) → id.
    encoder: HashMap<String, u32>,
    /// id → the raw bytes the token stands for.
    decoder: Vec<Vec<u8>>,
    /// Merge ranks, byte ids and the pre-token cache.
    model: BytePairModel,
    eod: u32,
    fingerprint: String,
}

fn read_file(path: &Path, what: &str) -> Result<String> {
    std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the GPT-2 {what} `{}`: check --{what}", path.display()))
}

impl Gpt2BpeTokenizer {
    pub fn from_config(config: &Gpt2BpeConfig) -> Result<Self> {
        Self::from_files(&config.vocab_file, &config.merge_file)
    }

    /// Loads `vocab.json` and `merges.txt`, validating both (every merge must name tokens of
    /// the vocabulary, ids must be distinct and dense).
    pub fn from_files(vocab_file: &Path, merge_file: &Path) -> Result<Self> {
        let vocab_text = read_file(vocab_file, "vocab-file")?;
        let merges_text = read_file(merge_file, "merge-file")?;
        let fingerprint = format!(
            "{NAME}:vocab-fnv1a64={:016x}:merges-fnv1a64={:016x}",
            fnv1a64(vocab_text.as_bytes()),
            fnv1a64(merges_text.as_bytes())
        );
        Self::from_strings(&vocab_text, vocab_file, &merges_text, merge_file, fingerprint)
    }

    fn from_strings(
        vocab_text: &str,
        vocab_file: &Path,
        merges_text: &str,
        merge_file: &Path,
        fingerprint: String,
    ) -> Result<Self> {
        let vf = vocab_file.display();
        let encoder: HashMap<String, u32> = serde_json::from_str(vocab_text).map_err(|e| {
            anyhow!("GPT-2 vocab file `{vf}` is not a JSON object of token → id ({e}); pass the GPT-2 vocab.json")
        })?;
        let table = byte_to_char_table();
        let inverse = char_to_byte_table(&table);
        let mut decoder: Vec<Option<Vec<u8>>> = vec![None; encoder.len()];
        for (token, &id) in &encoder {
            let slot = decoder.get_mut(id as usize).ok_or_else(|| {
                anyhow!("GPT-2 vocab file `{vf}`: id {id} of token {token:?} is not below the vocab size {}; ids must be 0..N-1", encoder.len())
            })?;
            if slot.is_some() {
                bail!("GPT-2 vocab file `{vf}`: id {id} is used by more than one token; the file is corrupt");
            }
            let bytes = token
                .chars()
                .map(|c| inverse.get(c as usize).copied().flatten())
                .collect::<Option<Vec<u8>>>()
                .ok_or_else(|| anyhow!("GPT-2 vocab file `{vf}`: token {token:?} contains a character outside GPT-2's byte map; this is not a byte-level BPE vocabulary"))?;
            *slot = Some(bytes);
        }
        // Distinct ids below `len` fill every slot, so this cannot fail after the checks above.
        let decoder: Vec<Vec<u8>> = decoder.into_iter().map(|d| d.unwrap_or_default()).collect();
        let mut byte_ids = [0u32; 256];
        for (b, id) in byte_ids.iter_mut().enumerate() {
            *id = *encoder.get(&table[b].to_string()).ok_or_else(|| {
                anyhow!(
                    "GPT-2 vocab file `{vf}` lacks the byte token {:?} (byte {b}); pass the GPT-2 vocab.json",
                    table[b]
                )
            })?;
        }
        let merges = parse_merges(merges_text, merge_file, &encoder)?;
        let eod = *encoder
            .get(EOD_TOKEN)
            .ok_or_else(|| anyhow!("GPT-2 vocab file `{vf}` has no `{EOD_TOKEN}` token (the eod)"))?;
        let model = BytePairModel::new(byte_ids, &merges);
        Ok(Gpt2BpeTokenizer { encoder, decoder, model, eod, fingerprint })
    }

    /// The id of a token string (in byte-mapped characters, e.g. `"Ġthe"`).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.encoder.get(token).copied()
    }

    /// GPT-2's ordinary encoding of `text`, appended to `ids`.
    fn encode_into(&self, text: &str, ids: &mut Vec<u32>) {
        pretokenize::for_each_piece(text, |piece| self.model.encode_piece(piece.as_bytes(), ids));
    }

    fn encode_ordinary(&self, text: &str) -> Vec<u32> {
        // ~4.5 bytes per token on English text; over-reserving is cheaper than regrowing.
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        self.encode_into(text, &mut ids);
        ids
    }

    /// Like `encode`, but a literal `<|endoftext|>` becomes the eod id (tiktoken's
    /// `encode(allowed_special="all")`).
    pub fn encode_with_special(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        for (k, chunk) in text.split(EOD_TOKEN).enumerate() {
            if k > 0 {
                ids.push(self.eod);
            }
            self.encode_into(chunk, &mut ids);
        }
        ids
    }
}

/// Parses `merges.txt`: an optional `#version` header, then one `left right` pair per line;
/// returns `(left id, right id, merged id)` in rank order.
fn parse_merges(text: &str, merge_file: &Path, encoder: &HashMap<String, u32>) -> Result<Vec<(u32, u32, u32)>> {
    let mf = merge_file.display();
    let mut merges = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if (n == 0 && line.starts_with("#version")) || line.is_empty() {
            continue;
        }
        let lineno = n + 1;
        let parts: Vec<&str> = line.split(' ').collect();
        let [left, right] = parts[..] else {
            bail!("GPT-2 merge file `{mf}` line {lineno}: expected `LEFT RIGHT`, found {line:?}; pass the GPT-2 merges.txt");
        };
        let id = |tok: &str| {
            encoder.get(tok).copied().ok_or_else(|| {
                anyhow!("GPT-2 merge file `{mf}` line {lineno}: token {tok:?} is not in the vocab file; the vocab and merge files do not belong together")
            })
        };
        let merged = format!("{left}{right}");
        merges.push((id(left)?, id(right)?, id(&merged)?));
    }
    Ok(merges)
}

impl Tokenizer for Gpt2BpeTokenizer {
    fn name(&self) -> &str {
        NAME
    }

    fn vocab_size(&self) -> usize {
        self.decoder.len()
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.encode_ordinary(text))
    }

    /// Invalid UTF-8 (ids cut inside a character) decodes to U+FFFD, like GPT-2's
    /// `errors="replace"`.
    fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for (pos, &id) in ids.iter().enumerate() {
            let token = self.decoder.get(id as usize).ok_or_else(|| {
                anyhow!("cannot decode id {id} at position {pos}: the GPT-2 vocabulary has {} ids", self.decoder.len())
            })?;
            bytes.extend_from_slice(token);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn special_ids(&self) -> SpecialIds {
        SpecialIds { eod: Some(self.eod), ..SpecialIds::default() }
    }

    fn fingerprint(&self) -> String {
        self.fingerprint.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy vocabulary: the 256 byte tokens, merges `h e`, `l l`, `he ll`, and the eod.
    fn toy() -> Result<Gpt2BpeTokenizer> {
        let table = byte_to_char_table();
        let mut vocab: serde_json::Map<String, serde_json::Value> =
            (0..256).map(|b| (table[b].to_string(), serde_json::Value::from(b))).collect();
        for (i, tok) in ["he", "ll", "hell", EOD_TOKEN].iter().enumerate() {
            vocab.insert(tok.to_string(), serde_json::Value::from(256 + i));
        }
        let vocab_text = serde_json::Value::Object(vocab).to_string();
        let merges = "#version: 0.2\nh e\nl l\nhe ll\n";
        Gpt2BpeTokenizer::from_strings(&vocab_text, Path::new("toy.json"), merges, Path::new("toy.txt"), "toy".into())
    }

    #[test]
    fn merges_apply_by_rank_and_decode_inverts() -> Result<()> {
        let tok = toy()?;
        assert_eq!(tok.vocab_size(), 260);
        assert_eq!(tok.encode("hello")?, vec![258, u32::from(b'o')]);
        let text = "hell, hello\n\tworld ☃";
        assert_eq!(tok.decode(&tok.encode(text)?)?, text);
        assert_eq!(tok.encode_with_special("a<|endoftext|>b"), vec![97, 259, 98]);
        assert!(tok.decode(&[260]).is_err());
        Ok(())
    }

    #[test]
    fn malformed_merges_name_file_and_line() -> Result<()> {
        let tok = toy()?;
        let err = parse_merges("#version: 0.2\nh e\nbad\n", Path::new("m.txt"), &tok.encoder)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("m.txt") && err.contains("line 3"), "{err}");
        let err =
            parse_merges("q zz\n", Path::new("m.txt"), &tok.encoder).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("line 1") && err.contains("\"zz\""), "{err}");
        Ok(())
    }

    #[test]
    fn malformed_vocab_names_the_file() {
        let err = Gpt2BpeTokenizer::from_strings("[1,2", Path::new("v.json"), "", Path::new("m"), String::new())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("v.json") && err.contains("line 1"), "{err}");
    }
}
