//! Unicode character classes used by the pre-tokenizers, with an ASCII fast path because
//! almost all text the tokenizers see is ASCII. GPT-2 uses the current general-category table
//! (`unicode-general-category`, Unicode 16, like the regex engines); BERT uses the older table
//! Hugging Face's BERT normalizer uses (`unicode_categories` 0.1.1), to give HF's ids.
//!
//! GPT-2 (`\p{L}`, `\p{N}`, `\s`) and BERT (whitespace, control, punctuation, CJK) use different
//! definitions; each function says which one it implements.

use unicode_categories::UnicodeCategories;
use unicode_general_category::{get_general_category, GeneralCategory as G};

/// Class bits of one char for the GPT-2 pre-tokenizer.
pub const LETTER: u8 = 1;
pub const NUMBER: u8 = 2;
pub const SPACE: u8 = 4;
/// Neither letter, number nor space (`[^\s\p{L}\p{N}]`).
pub const OTHER: u8 = 8;

/// GPT-2 classes of the 128 ASCII chars, so the hot loop never consults the Unicode table.
static ASCII_GPT2: [u8; 128] = {
    let mut t = [OTHER; 128];
    let mut b = 0;
    while b < 128 {
        let c = b as u8;
        t[b] = if c.is_ascii_alphabetic() {
            LETTER
        } else if c.is_ascii_digit() {
            NUMBER
        } else if matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r') {
            // ASCII `White_Space`: U+0009..U+000D and U+0020 (not U+001C..U+001F).
            SPACE
        } else {
            OTHER
        };
        b += 1;
    }
    t
};

/// The GPT-2 class of an ASCII byte (`b < 128`).
#[inline]
pub fn gpt2_ascii_class(b: u8) -> u8 {
    ASCII_GPT2[b as usize & 0x7f]
}

/// The GPT-2 class of any char: `\p{L}` = Lu+Ll+Lt+Lm+Lo, `\p{N}` = Nd+Nl+No, `\s` = the
/// Unicode `White_Space` property ([`char::is_whitespace`]), like the `regex`/`fancy-regex`
/// engines tiktoken and Hugging Face use.
#[inline]
pub fn gpt2_class(c: char) -> u8 {
    if c.is_ascii() {
        return ASCII_GPT2[c as usize];
    }
    if c.is_whitespace() {
        return SPACE;
    }
    match get_general_category(c) {
        G::UppercaseLetter | G::LowercaseLetter | G::TitlecaseLetter | G::ModifierLetter | G::OtherLetter => LETTER,
        G::DecimalNumber | G::LetterNumber | G::OtherNumber => NUMBER,
        _ => OTHER,
    }
}

/// `\p{L}`.
pub fn is_letter(c: char) -> bool {
    gpt2_class(c) == LETTER
}

/// `\p{N}`.
pub fn is_number(c: char) -> bool {
    gpt2_class(c) == NUMBER
}

/// `\s`.
pub fn is_space(c: char) -> bool {
    gpt2_class(c) == SPACE
}

/// BERT whitespace: `\t`, `\n`, `\r` and `White_Space` (Hugging Face's `BertNormalizer`; it
/// also uses the standard library here).
pub fn is_bert_whitespace(c: char) -> bool {
    c.is_whitespace()
}

// The BERT classes below use `unicode_categories` 0.1.1, the table Hugging Face's
// `BertNormalizer`/`BertPreTokenizer` use, not the current Unicode data: users compare ids
// with HF, and code points assigned since that table differ (issue 10).

/// BERT control chars, removed by "clean text": Hugging Face's `is_other` = Cc, Cf and Co of its
/// table, except `\t`, `\n`, `\r` (whitespace). Unassigned code points (Cn) are kept.
pub fn is_bert_control(c: char) -> bool {
    if matches!(c, '\t' | '\n' | '\r') {
        return false;
    }
    if c.is_ascii() {
        return c.is_ascii_control();
    }
    c.is_other()
}

/// BERT punctuation: all non-alphanumeric printable ASCII (so `$`, `+`, `^`, `` ` `` count,
/// as in the original BERT) and every `P*` category of Hugging Face's table.
pub fn is_bert_punctuation(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_punctuation();
    }
    c.is_punctuation()
}

/// Nonspacing marks (`Mn` of Hugging Face's table), dropped after NFD when BERT strips accents.
pub fn is_nonspacing_mark(c: char) -> bool {
    !c.is_ascii() && c.is_mark_nonspacing()
}

/// The CJK ideograph blocks BERT surrounds with spaces. Hangul, kana etc. are not included.
/// These are Hugging Face `BertNormalizer`'s ranges (the goldens' reference): they start the
/// Extension E block at U+2B920 where Google BERT's `_is_chinese_char` has U+2B820, so the 256
/// ideographs U+2B820..U+2B91F are not split out (neither tokenizer knows them: both give
/// `[UNK]`, but for different spans).
pub fn is_cjk_ideograph(c: char) -> bool {
    matches!(
        c as u32,
        0x4E00..=0x9FFF
            | 0x3400..=0x4DBF
            | 0x20000..=0x2A6DF
            | 0x2A700..=0x2B73F
            | 0x2B740..=0x2B81F
            | 0x2B920..=0x2CEAF
            | 0xF900..=0xFAFF
            | 0x2F800..=0x2FA1F
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_classes_follow_the_general_category() {
        for (c, want) in [
            ('a', LETTER),
            ('Z', LETTER),
            ('é', LETTER),
            ('日', LETTER),
            ('ǅ', LETTER), // Lt
            ('ʰ', LETTER), // Lm
            ('7', NUMBER),
            ('٣', NUMBER), // Nd (Arabic-Indic)
            ('Ⅻ', NUMBER), // Nl
            ('½', NUMBER), // No
            ('²', NUMBER), // No
            (' ', SPACE),
            ('\u{a0}', SPACE),
            ('\u{3000}', SPACE),
            ('\u{1c}', OTHER), // not White_Space, unlike Python's str.isspace
            ('!', OTHER),
            ('\u{301}', OTHER), // combining acute (Mn) is not a letter
            ('\u{93e}', OTHER), // Devanagari vowel sign AA (Mc, Other_Alphabetic): not \p{L}
            ('Ⓐ', OTHER),       // So (Other_Alphabetic): not \p{L}
            ('😀', OTHER),
        ] {
            assert_eq!(gpt2_class(c), want, "{c:?} U+{:04X}", c as u32);
        }
        for b in 0..128u8 {
            let c = char::from(b);
            let slow = if c.is_alphabetic() {
                LETTER
            } else if c.is_numeric() {
                NUMBER
            } else if c.is_whitespace() {
                SPACE
            } else {
                OTHER
            };
            assert_eq!(gpt2_ascii_class(b), slow, "byte {b}");
        }
    }

    #[test]
    fn bert_classes() {
        assert!(is_bert_punctuation('$') && is_bert_punctuation('`') && is_bert_punctuation('¿'));
        assert!(!is_bert_punctuation('€') && !is_bert_punctuation('a'));
        assert!(is_bert_control('\u{0}') && is_bert_control('\u{200b}') && is_bert_control('\u{ad}'));
        assert!(is_bert_control('\u{e000}') && !is_bert_control('\u{1d4a7}')); // Co removed, Cn kept
        assert!(!is_bert_control('\n') && !is_bert_control(' ') && !is_bert_control('a'));
        assert!(is_bert_whitespace('\t') && is_bert_whitespace('\u{2028}'));
        assert!(is_nonspacing_mark('\u{301}') && !is_nonspacing_mark('e'));
        assert!(is_cjk_ideograph('中') && !is_cjk_ideograph('한') && !is_cjk_ideograph('の'));
        // Assigned after Hugging Face's table (issue 10): HF treats them as letters, so must we.
        assert!(!is_bert_punctuation('\u{2e44}') && !is_bert_punctuation('\u{2e69}'));
        assert!(!is_nonspacing_mark('\u{1dfa}'));
        assert!(is_bert_punctuation('\u{2e3b}') && is_nonspacing_mark('\u{1df5}'));
        // in its table
    }
}
