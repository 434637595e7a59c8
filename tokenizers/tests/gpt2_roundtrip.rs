//! Property test: GPT-2 `decode(encode(x)) == x` for arbitrary UTF-8 — random strings mixing
//! ASCII, whitespace runs, control chars, Latin/Greek/Cyrillic, combining marks, CJK, Hangul,
//! emoji (incl. ZWJ sequences and skin tones) and random scalar values from all planes.
//! Skips when `shared/data` is absent.

mod common;

use common::{data_dir, Rng};
use megatron_core::Tokenizer;
use megatron_tokenizers::Gpt2BpeTokenizer;

/// Alphabets the generator draws from, each a set of code point ranges.
const POOLS: &[&[(u32, u32)]] = &[
    &[(0x61, 0x7a), (0x41, 0x5a), (0x30, 0x39)], // ASCII alphanumerics
    &[(0x20, 0x2f), (0x3a, 0x40), (0x5b, 0x60)], // ASCII punctuation and space
    &[(0x09, 0x0d), (0x20, 0x20), (0xa0, 0xa0), (0x3000, 0x3000), (0x2028, 0x2029)], // whitespace
    &[(0x00, 0x08), (0x0e, 0x1f), (0x7f, 0x9f)], // control chars
    &[(0xc0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff)], // Latin-1/Ext, Greek, Cyrillic
    &[(0x300, 0x36f), (0x93e, 0x94c), (0x200b, 0x200d)], // combining marks, vowel signs, ZW*
    &[(0x4e00, 0x9fff), (0xac00, 0xd7a3), (0x3040, 0x30ff)], // CJK, Hangul, kana
    &[(0x1f300, 0x1faff), (0x1f3fb, 0x1f3ff), (0xfe0f, 0xfe0f)], // emoji, skin tones, VS16
    &[(0x0, 0x10ffff)],                          // anything
];

fn random_string(rng: &mut Rng) -> String {
    let len = rng.below(40);
    let mut s = String::new();
    for _ in 0..len {
        let pool = POOLS[rng.below(POOLS.len())];
        let (lo, hi) = pool[rng.below(pool.len())];
        let cp = lo + (rng.next() % u64::from(hi - lo + 1)) as u32;
        // Surrogates are not chars; use U+FFFD instead (it must round-trip too).
        s.push(char::from_u32(cp).unwrap_or('\u{fffd}'));
        if rng.below(8) == 0 {
            // Whitespace runs of varying length.
            s.push_str(&" ".repeat(rng.below(4)));
        }
    }
    s
}

#[test]
fn decode_inverts_encode_on_random_unicode() -> anyhow::Result<()> {
    let Some(dir) = data_dir("gpt2/vocab.json") else { return Ok(()) };
    let tok = Gpt2BpeTokenizer::from_files(&dir.join("gpt2/vocab.json"), &dir.join("gpt2/merges.txt"))?;
    let mut rng = Rng(0x5eed);
    for case in 0..3000 {
        let text = random_string(&mut rng);
        let ids = tok.encode(&text)?;
        assert!(ids.len() <= text.len(), "case {case}: more ids than bytes for {text:?}");
        assert_eq!(tok.decode(&ids)?, text, "case {case}: ids {ids:?}");
        // Encoding in two halves at a char boundary can only change the ids, never the bytes.
        let mid = text.char_indices().nth(text.chars().count() / 2).map_or(0, |(i, _)| i);
        let mut split = tok.encode(&text[..mid])?;
        split.extend(tok.encode(&text[mid..])?);
        assert_eq!(tok.decode(&split)?, text, "case {case} split");
    }
    Ok(())
}
