//! Megatron's `NullTokenizer` (SPEC §3.1): text is whitespace-separated integer ids. With
//! `--vocab-size V` the ids are `0..V-1` plus the eod `V`, so the reported vocabulary size is
//! `V + 1` (like Megatron's `_NullTokenizer`).

use anyhow::{anyhow, bail};
use megatron_core::{Result, SpecialIds, Tokenizer};
use serde::Deserialize;

/// The `--tokenizer-type` name.
pub const NAME: &str = "NullTokenizer";

/// Config of the `NullTokenizer` plugin (Megatron's `--vocab-size`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NullTokenizerConfig {
    pub vocab_size: usize,
}

/// Ids in, ids out.
#[derive(Clone, Debug)]
pub struct NullTokenizer {
    /// `V`: ids without the eod.
    vocab_size_without_eod: usize,
}

impl NullTokenizer {
    pub fn new(vocab_size: usize) -> Result<Self> {
        if vocab_size == 0 || vocab_size >= u32::MAX as usize {
            bail!("NullTokenizer: --vocab-size must be between 1 and {}, got {vocab_size}", u32::MAX - 1);
        }
        Ok(NullTokenizer { vocab_size_without_eod: vocab_size })
    }

    fn eod(&self) -> u32 {
        self.vocab_size_without_eod as u32
    }
}

impl Tokenizer for NullTokenizer {
    fn name(&self) -> &str {
        NAME
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size_without_eod + 1
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        text.split_whitespace()
            .map(|word| {
                let id: u32 = word.parse().map_err(|_| {
                    anyhow!("NullTokenizer: {word:?} is not a token id; its text must be whitespace-separated integers")
                })?;
                if id as usize >= self.vocab_size() {
                    bail!(
                        "NullTokenizer: id {id} is out of range; ids must be below {} (--vocab-size + 1)",
                        self.vocab_size()
                    );
                }
                Ok(id)
            })
            .collect()
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        Ok(ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" "))
    }

    fn special_ids(&self) -> SpecialIds {
        SpecialIds { eod: Some(self.eod()), ..SpecialIds::default() }
    }

    fn fingerprint(&self) -> String {
        format!("{NAME}:vocab_size={}", self.vocab_size_without_eod)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_ids_and_reports_eod() -> Result<()> {
        let tok = NullTokenizer::new(100)?;
        assert_eq!(tok.vocab_size(), 101);
        assert_eq!(tok.special_ids().eod, Some(100));
        assert_eq!(tok.encode(" 1 22\t99\n100 ")?, vec![1, 22, 99, 100]);
        assert_eq!(tok.decode(&[1, 22, 99])?, "1 22 99");
        assert!(tok.encode("1 101").is_err());
        assert!(tok.encode("1 x").is_err());
        assert!(tok.encode("-3").is_err());
        assert!(NullTokenizer::new(0).is_err());
        Ok(())
    }
}
