//! GPT-2's pre-tokenizer, written out by hand instead of with a regex engine. It splits text
//! exactly like the pattern
//! `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
//! (alternatives tried in order at each position, leftmost-first like Python's `regex` and
//! tiktoken's `fancy-regex`). The character classes are exact (see [`crate::unicode_class`]).
//!
//! It scans bytes, with a table lookup per ASCII byte and a general-category lookup only for
//! non-ASCII chars, and hands out `&str` slices of the input: no allocation per piece.

use crate::unicode_class::{gpt2_ascii_class, gpt2_class, LETTER, NUMBER, OTHER, SPACE};

/// The class and UTF-8 length of the char starting at byte `i` (a char boundary).
#[inline]
fn class_at(text: &str, i: usize) -> (u8, usize) {
    let b = text.as_bytes()[i];
    if b < 0x80 {
        return (gpt2_ascii_class(b), 1);
    }
    // `i` is a char boundary inside `text`, so there is a char here.
    let c = text[i..].chars().next().unwrap_or('\u{fffd}');
    (gpt2_class(c), c.len_utf8())
}

/// Byte index just past the run of chars of class `class` starting at byte `i`.
#[inline]
fn run_end(text: &str, mut i: usize, class: u8) -> usize {
    let bytes = text.as_bytes();
    while i < bytes.len() {
        let b = bytes[i];
        if b < 0x80 {
            if gpt2_ascii_class(b) != class {
                break;
            }
            i += 1;
        } else {
            let (c, len) = class_at(text, i);
            if c != class {
                break;
            }
            i += len;
        }
    }
    i
}

/// The byte length of a contraction (`'s 't 're 've 'm 'll 'd`) starting at byte `i`.
#[inline]
fn contraction_len(bytes: &[u8], i: usize) -> Option<usize> {
    if bytes[i] != b'\'' {
        return None;
    }
    match (bytes.get(i + 1), bytes.get(i + 2)) {
        (Some(b's' | b't' | b'm' | b'd'), _) => Some(2),
        (Some(b'r' | b'v'), Some(b'e')) | (Some(b'l'), Some(b'l')) => Some(3),
        _ => None,
    }
}

/// The byte index just past the pre-token that starts at byte `i`.
#[inline]
fn next_piece(text: &str, i: usize) -> usize {
    let bytes = text.as_bytes();
    if let Some(len) = contraction_len(bytes, i) {
        return i + len;
    }
    // ` ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+`: the optional prefix is U+0020 only.
    let body = if bytes[i] == b' ' { i + 1 } else { i };
    if body < bytes.len() {
        let (class, len) = class_at(text, body);
        if class & (LETTER | NUMBER | OTHER) != 0 {
            return run_end(text, body + len, class);
        }
    }
    // `\s+(?!\S)`: the whitespace run minus its last char when a non-space follows (that char
    // may prefix the next word); plain `\s+` when that would leave nothing.
    let end = run_end(text, i, SPACE);
    if end == bytes.len() {
        return end;
    }
    // Step back over the last char of the run (it may be multi-byte, e.g. U+3000).
    let mut last = end - 1;
    while !text.is_char_boundary(last) {
        last -= 1;
    }
    if last == i {
        end
    } else {
        last
    }
}

/// Calls `f` on each GPT-2 pre-token of `text`, in order; concatenated they give `text` back.
#[inline]
pub fn for_each_piece<'a>(text: &'a str, mut f: impl FnMut(&'a str)) {
    let mut i = 0;
    while i < text.len() {
        let end = next_piece(text, i);
        f(&text[i..end]);
        i = end;
    }
}

/// Splits `text` into GPT-2 pre-tokens; concatenating them gives `text` back.
pub fn split(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    for_each_piece(text, |p| pieces.push(p));
    pieces
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn splits_like_the_gpt2_pattern() {
        assert_eq!(split("Hello world"), ["Hello", " world"]);
        assert_eq!(split("I'm fine, you'll see"), ["I", "'m", " fine", ",", " you", "'ll", " see"]);
        assert_eq!(split("DON'T"), ["DON", "'", "T"]);
        assert_eq!(split("a  b"), ["a", " ", " b"]);
        assert_eq!(split("a \tb"), ["a", " ", "\t", "b"]);
        assert_eq!(split("x   "), ["x", "   "]);
        assert_eq!(split(" 123abc!?"), [" 123", "abc", "!?"]);
        assert_eq!(split("!'s"), ["!'", "s"]);
        assert_eq!(split("\n\nFirst"), ["\n", "\n", "First"]);
        assert_eq!(split("café 3.14"), ["café", " 3", ".", "14"]);
        assert_eq!(split("a\u{3000}\u{3000}b"), ["a", "\u{3000}", "\u{3000}", "b"]);
        assert_eq!(split("x ½²"), ["x", " ½²"]);
        // Combining marks and Mc vowel signs are "other", not letters.
        assert_eq!(split("e\u{301}x"), ["e", "\u{301}", "x"]);
        assert_eq!(split("का"), ["क", "ा"]);
        assert!(split("").is_empty());
    }

    #[test]
    fn pieces_concatenate_to_the_input() {
        let text = "  Mixed\r\n text\u{a0}with 日本語, emoji 👍🏽 and 'quotes' \t\n";
        assert_eq!(split(text).concat(), text);
    }
}
