//! Megatron's `BertWordPieceLowerCase` / `BertWordPieceCase` (SPEC §3.1): BERT's basic
//! tokenizer ([`crate::bert_basic`]) then greedy longest-match-first WordPiece with `##`
//! continuations; a word longer than 100 chars, or one that cannot be covered, is `[UNK]`.
//!
//! Special tokens follow Megatron's legacy `_BertWordPieceTokenizer`: `cls/sep/pad/mask/unk`
//! come from `vocab.txt`; `[BOS]` and `[EOS]` are appended to the vocabulary when missing, and
//! `eod = eos = [EOS]` (so bert-base-uncased's 30522 lines give a vocabulary of 30524); then
//! `vocab_extra_ids` T5 sentinels `<extra_id_0..N-1>`. Appended tokens are never matched in
//! text (Megatron's `tokenize` does not either); they only decode.

use crate::bert_basic;
use crate::fast_hash::{fx_map_with_capacity, FxHashMap};
use crate::fingerprint::fnv1a64;
use anyhow::{anyhow, bail, Context};
use megatron_core::{Result, SpecialIds, Tokenizer};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The `--tokenizer-type` names.
pub const NAME_LOWER: &str = "BertWordPieceLowerCase";
pub const NAME_CASE: &str = "BertWordPieceCase";
/// Words with more chars than this become `[UNK]` (BERT's `max_input_chars_per_word`).
pub const MAX_CHARS_PER_WORD: usize = 100;
/// The continuation prefix.
const CONTINUATION: &str = "##";

/// Config of both BERT plugins (Megatron's `--vocab-file`, `--vocab-extra-ids`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BertWordPieceConfig {
    pub vocab_file: PathBuf,
    #[serde(default)]
    pub vocab_extra_ids: usize,
}

/// BERT WordPiece tokenizer.
pub struct BertWordPieceTokenizer {
    lower_case: bool,
    /// Word-initial tokens → id.
    starts: FxHashMap<Box<str>, u32>,
    /// `##` tokens, stored without the prefix (so lookups need no allocation) → id.
    continuations: FxHashMap<Box<str>, u32>,
    /// id → token string (with its `##`), including the appended special tokens.
    tokens: Vec<String>,
    special: SpecialIds,
    unk: u32,
    fingerprint: String,
}

impl BertWordPieceTokenizer {
    pub fn from_config(config: &BertWordPieceConfig, lower_case: bool) -> Result<Self> {
        Self::from_file(&config.vocab_file, lower_case, config.vocab_extra_ids)
    }

    /// Loads `vocab.txt` (one token per line, id = line number from 0).
    pub fn from_file(vocab_file: &Path, lower_case: bool, vocab_extra_ids: usize) -> Result<Self> {
        let text = std::fs::read_to_string(vocab_file).with_context(|| {
            format!("cannot read the BERT vocab file `{}`: check --vocab-file", vocab_file.display())
        })?;
        let name = if lower_case { NAME_LOWER } else { NAME_CASE };
        let fingerprint = format!("{name}:vocab-fnv1a64={:016x}:extra-ids={vocab_extra_ids}", fnv1a64(text.as_bytes()));
        Self::from_vocab_text(&text, vocab_file, lower_case, vocab_extra_ids, fingerprint)
    }

    fn from_vocab_text(
        text: &str,
        vocab_file: &Path,
        lower_case: bool,
        vocab_extra_ids: usize,
        fingerprint: String,
    ) -> Result<Self> {
        let vf = vocab_file.display();
        // Like BERT's `load_vocab`: every line is a token (surrounding whitespace stripped).
        let mut tokens: Vec<String> = text.lines().map(|l| l.trim().to_string()).collect();
        if tokens.is_empty() {
            bail!("BERT vocab file `{vf}` is empty; pass a vocab.txt with one token per line");
        }
        let mut starts = fx_map_with_capacity(tokens.len());
        let mut continuations = fx_map_with_capacity(tokens.len());
        for (id, tok) in tokens.iter().enumerate() {
            let (map, key) = match tok.strip_prefix(CONTINUATION) {
                Some(rest) if !rest.is_empty() => (&mut continuations, rest),
                _ => (&mut starts, tok.as_str()),
            };
            if map.insert(key.into(), id as u32).is_some() {
                bail!("BERT vocab file `{vf}` line {}: token {tok:?} appears twice; the file is corrupt", id + 1);
            }
        }
        let id_of = |tok: &str| -> Result<u32> {
            starts.get(tok).copied().ok_or_else(|| {
                anyhow!("BERT vocab file `{vf}` has no {tok} token; pass a BERT vocab.txt (it needs [PAD] [UNK] [CLS] [SEP] [MASK])")
            })
        };
        let (pad, unk, cls, sep, mask) =
            (id_of("[PAD]")?, id_of("[UNK]")?, id_of("[CLS]")?, id_of("[SEP]")?, id_of("[MASK]")?);
        let append = |tok: String, tokens: &mut Vec<String>| -> u32 {
            if let Some(&id) = starts.get(tok.as_str()) {
                return id;
            }
            let id = tokens.len() as u32;
            tokens.push(tok);
            id
        };
        let bos = append("[BOS]".into(), &mut tokens);
        let eos = append("[EOS]".into(), &mut tokens);
        for i in 0..vocab_extra_ids {
            append(format!("<extra_id_{i}>"), &mut tokens);
        }
        let special = SpecialIds {
            eod: Some(eos),
            pad: Some(pad),
            cls: Some(cls),
            sep: Some(sep),
            mask: Some(mask),
            bos: Some(bos),
            eos: Some(eos),
        };
        Ok(BertWordPieceTokenizer { lower_case, starts, continuations, tokens, special, unk, fingerprint })
    }

    /// The id of a token as written in `vocab.txt` (e.g. `"##ing"`).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        match token.strip_prefix(CONTINUATION) {
            Some(rest) if !rest.is_empty() => self.continuations.get(rest).copied(),
            _ => self.starts.get(token).copied(),
        }
    }

    /// `[UNK]`'s id.
    pub fn unk_id(&self) -> u32 {
        self.unk
    }

    /// Greedy longest-match-first WordPiece of one word, appended to `out`.
    fn wordpiece(&self, word: &str, out: &mut Vec<u32>) {
        if let Some(&id) = self.starts.get(word) {
            out.push(id);
            return;
        }
        // Counting chars is only needed when the byte length could exceed the limit.
        if word.len() > MAX_CHARS_PER_WORD && word.chars().count() > MAX_CHARS_PER_WORD {
            out.push(self.unk);
            return;
        }
        let mark = out.len();
        let mut start = 0;
        while start < word.len() {
            let map = if start == 0 { &self.starts } else { &self.continuations };
            let mut end = word.len();
            let found = loop {
                if let Some(&id) = map.get(&word[start..end]) {
                    break Some(id);
                }
                // Shorten by one char.
                end -= 1;
                while end > start && !word.is_char_boundary(end) {
                    end -= 1;
                }
                if end == start {
                    break None;
                }
            };
            match found {
                Some(id) => out.push(id),
                None => {
                    out.truncate(mark);
                    out.push(self.unk);
                    return;
                }
            }
            start = end;
        }
    }

    /// Token ids of `text` without `[CLS]`/`[SEP]`, appended to `out`; `scratch` holds the
    /// normalized text.
    fn encode_into(&self, text: &str, scratch: &mut String, out: &mut Vec<u32>) {
        bert_basic::normalize(text, self.lower_case, scratch);
        bert_basic::for_each_word(scratch, |w| self.wordpiece(w, out));
    }

    /// `[CLS] ids [SEP]`, the single-sequence BERT input.
    pub fn encode_with_special(&self, text: &str) -> Vec<u32> {
        let mut ids = vec![self.special.cls.unwrap_or(self.unk)];
        self.encode_into(text, &mut String::new(), &mut ids);
        ids.push(self.special.sep.unwrap_or(self.unk));
        ids
    }
}

impl Tokenizer for BertWordPieceTokenizer {
    fn name(&self) -> &str {
        if self.lower_case {
            NAME_LOWER
        } else {
            NAME_CASE
        }
    }

    fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::with_capacity(text.len() / 4 + 1);
        self.encode_into(text, &mut String::new(), &mut ids);
        Ok(ids)
    }

    /// BERT's `convert_tokens_to_string`: tokens joined by spaces, `" ##"` removed. Lossy by
    /// nature (case, accents, spacing around punctuation are gone).
    fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut text = String::with_capacity(ids.len() * 6);
        for (pos, &id) in ids.iter().enumerate() {
            let tok = self.tokens.get(id as usize).ok_or_else(|| {
                anyhow!("cannot decode id {id} at position {pos}: the BERT vocabulary has {} ids", self.tokens.len())
            })?;
            match tok.strip_prefix(CONTINUATION) {
                Some(rest) if !text.is_empty() => text.push_str(rest),
                _ => {
                    if !text.is_empty() {
                        text.push(' ');
                    }
                    text.push_str(tok);
                }
            }
        }
        Ok(text)
    }

    fn special_ids(&self) -> SpecialIds {
        self.special
    }

    fn fingerprint(&self) -> String {
        self.fingerprint.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VOCAB: &str = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nun\n##aff\n##able\nrun\n##ning\n,\nhello\n##é\nx\n";

    fn toy(lower: bool, extra: usize) -> Result<BertWordPieceTokenizer> {
        BertWordPieceTokenizer::from_vocab_text(VOCAB, Path::new("v.txt"), lower, extra, "toy".into())
    }

    #[test]
    fn greedy_longest_match_with_continuations() -> Result<()> {
        let t = toy(true, 0)?;
        assert_eq!(t.encode("unaffable, running")?, [5, 6, 7, 10, 8, 9]);
        assert_eq!(t.encode("HELLO unxyz")?, [11, 1]);
        assert_eq!(t.encode_with_special("hello"), [2, 11, 3]);
        assert_eq!(t.decode(&[5, 6, 7, 10, 8, 9])?, "unaffable , running");
        let long = "x".repeat(MAX_CHARS_PER_WORD + 1);
        assert_eq!(t.encode(&long)?, [1]);
        // Exactly 100 chars is still tokenized (as x ##?...): x alone then no `##x` → [UNK].
        assert_eq!(t.encode(&"x".repeat(MAX_CHARS_PER_WORD))?, [1]);
        // Cased: no lower-casing, accents kept and matched by char.
        let c = toy(false, 0)?;
        assert_eq!(c.encode("HELLO hello")?, [1, 11]);
        assert_eq!(c.encode("xé")?, [13, 12]);
        Ok(())
    }

    #[test]
    fn special_ids_follow_megatron() -> Result<()> {
        let t = toy(true, 3)?;
        let s = t.special_ids();
        assert_eq!((s.pad, s.cls, s.sep, s.mask), (Some(0), Some(2), Some(3), Some(4)));
        // [BOS], [EOS] appended after the 14 lines, then 3 sentinels.
        assert_eq!((s.bos, s.eos, s.eod), (Some(14), Some(15), Some(15)));
        assert_eq!(t.vocab_size(), 19);
        assert_eq!(t.decode(&[16, 18])?, "<extra_id_0> <extra_id_2>");
        assert_eq!(t.name(), NAME_LOWER);
        assert!(t.decode(&[19]).is_err());
        Ok(())
    }

    #[test]
    fn bad_vocab_files_are_named() {
        let err = |text: &str| {
            BertWordPieceTokenizer::from_vocab_text(text, Path::new("bad.txt"), true, 0, String::new())
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(err("").contains("bad.txt"));
        let e = err("[PAD]\n[UNK]\n[CLS]\n[SEP]\n");
        assert!(e.contains("bad.txt") && e.contains("[MASK]"), "{e}");
        let e = err("[PAD]\n[UNK]\n[PAD]\n");
        assert!(e.contains("line 3") && e.contains("twice"), "{e}");
    }
}
