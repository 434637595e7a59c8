//! BERT's `BasicTokenizer`, in the form of Hugging Face's `BertNormalizer` + `BertPreTokenizer`
//! (which the goldens in `shared/data/golden` come from and which agree with Google's
//! `tokenization.py`):
//! 1. clean text: drop NUL, U+FFFD and control/format chars (`C*`), map whitespace to ' ';
//! 2. put spaces around CJK ideographs;
//! 3. lower-case variant only: NFD, drop nonspacing marks (accents), then lower-case;
//! 4. split at whitespace (dropped) and around every punctuation char (kept as a word).
//!
//! Steps 1–3 are applied to the whole text in that order (as Hugging Face does); all-ASCII
//! text skips the Unicode normalization.

use crate::unicode_class::{
    is_bert_control, is_bert_punctuation, is_bert_whitespace, is_cjk_ideograph, is_nonspacing_mark,
};
// Hugging Face's NFD (Unicode 9.0 tables), not `unicode-normalization`'s current ones.
use unicode_normalization_alignments::UnicodeNormalization;

/// Steps 1–3: writes the normalized `text` into `out` (cleared first).
pub fn normalize(text: &str, lower_case: bool, out: &mut String) {
    out.clear();
    out.reserve(text.len() + 8);
    if text.is_ascii() {
        for b in text.bytes() {
            match b {
                b'\t' | b'\n' | b'\r' | b' ' => out.push(' '),
                // Control chars (incl. NUL, and VT/FF although they are White_Space) are removed:
                // cleaning drops controls before it maps whitespace.
                0..=0x1f | 0x7f => {}
                _ => out.push(char::from(if lower_case { b.to_ascii_lowercase() } else { b })),
            }
        }
        return;
    }
    for c in text.chars() {
        if c == '\0' || c == '\u{fffd}' || is_bert_control(c) {
            continue;
        }
        if is_bert_whitespace(c) {
            out.push(' ');
        } else if is_cjk_ideograph(c) {
            out.push(' ');
            out.push(c);
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    if lower_case {
        // Accents are stripped before lower-casing, in Hugging Face's order.
        let stripped: String =
            out.nfd().map(|(c, _)| c).filter(|&c| !is_nonspacing_mark(c)).flat_map(char::to_lowercase).collect();
        *out = stripped;
    }
}

/// Step 4: calls `f` on each word of normalized text: maximal runs of non-space,
/// non-punctuation chars, and every punctuation char on its own.
pub fn for_each_word<'a>(normalized: &'a str, mut f: impl FnMut(&'a str)) {
    let bytes = normalized.as_bytes();
    let mut start = None;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let (c, len) = if b < 0x80 {
            (char::from(b), 1)
        } else {
            let c = normalized[i..].chars().next().unwrap_or('\u{fffd}');
            (c, c.len_utf8())
        };
        let space = if b < 0x80 { b == b' ' || (0x09..=0x0d).contains(&b) } else { is_bert_whitespace(c) };
        if space || is_bert_punctuation(c) {
            if let Some(s) = start.take() {
                f(&normalized[s..i]);
            }
            if !space {
                f(&normalized[i..i + len]);
            }
        } else if start.is_none() {
            start = Some(i);
        }
        i += len;
    }
    if let Some(s) = start {
        f(&normalized[s..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str, lower: bool) -> Vec<String> {
        let mut n = String::new();
        normalize(text, lower, &mut n);
        let mut out = vec![];
        for_each_word(&n, |w| out.push(w.to_string()));
        out
    }

    #[test]
    fn splits_like_bert_basic_tokenizer() {
        assert_eq!(words("Hello, World!", true), ["hello", ",", "world", "!"]);
        assert_eq!(words("Hello, World!", false), ["Hello", ",", "World", "!"]);
        assert_eq!(words("  a\tb\r\nc  ", true), ["a", "b", "c"]);
        assert_eq!(words("ab\u{1}cd e\u{200b}f", true), ["abcd", "ef"]);
        assert_eq!(words("Café Ångström naïve", true), ["cafe", "angstrom", "naive"]);
        assert_eq!(words("Café", false), ["Café"]);
        assert_eq!(words("中文abc日本", true), ["中", "文", "abc", "日", "本"]);
        assert_eq!(words("$5+3^2 `x`", true), ["$", "5", "+", "3", "^", "2", "`", "x", "`"]);
        assert_eq!(words("«q» ¿sí?", true), ["«", "q", "»", "¿", "si", "?"]);
        assert_eq!(words("€100 ©", true), ["€100", "©"]);
        assert!(words(" \u{0} ", true).is_empty());
    }

    #[test]
    fn ascii_fast_path_equals_the_unicode_path() {
        // Appending a non-ASCII letter forces the general path; the ASCII words must not change.
        let text = "It's 3:15pm -- \"OK\"\ttab\u{7}bell\r\nnew_line (x)\u{b}vt\u{c}ff";
        for lower in [false, true] {
            let fast = words(text, lower);
            let mut slow = words(&format!("{text} é"), lower);
            assert_eq!(slow.pop().as_deref(), Some(if lower { "e" } else { "é" }));
            assert_eq!(fast, slow, "lower={lower}");
        }
    }
}
