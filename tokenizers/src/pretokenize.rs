//! GPT-2's pre-tokenizer, written out by hand instead of with a regex engine. It splits text
//! exactly like the pattern
//! `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
//! (alternatives tried in order at each position, leftmost-first like Python's `regex` and
//! tiktoken's `fancy-regex`).
//!
//! Character classes: `\s` is Unicode `White_Space` = [`char::is_whitespace`] and `\p{N}` is
//! Nd+Nl+No = [`char::is_numeric`], both exact. `\p{L}` is approximated by
//! `is_alphabetic() && !is_numeric()`: that is `L` plus the `Other_Alphabetic` characters
//! (mostly combining vowel signs of Indic/Arabic/Hebrew scripts and circled letters), which the
//! real pattern treats as "other". Text without such characters splits identically.

/// `\p{L}` (approximation, see the module doc).
pub fn is_letter(c: char) -> bool {
    c.is_alphabetic() && !c.is_numeric()
}

/// `\p{N}`.
pub fn is_number(c: char) -> bool {
    c.is_numeric()
}

/// `\s`.
pub fn is_space(c: char) -> bool {
    c.is_whitespace()
}

/// `[^\s\p{L}\p{N}]`.
fn is_other(c: char) -> bool {
    !is_space(c) && !is_letter(c) && !is_number(c)
}

/// The length in chars of a contraction (`'s 't 're 've 'm 'll 'd`) starting at `chars[i]`.
fn contraction_len(chars: &[char], i: usize) -> Option<usize> {
    if chars[i] != '\'' {
        return None;
    }
    let next = chars.get(i + 1).copied();
    let after = chars.get(i + 2).copied();
    match (next, after) {
        (Some('s' | 't' | 'm' | 'd'), _) => Some(2),
        (Some('r' | 'v'), Some('e')) | (Some('l'), Some('l')) => Some(3),
        _ => None,
    }
}

/// Index just past the run of chars satisfying `class` that starts at `i`.
fn run_end(chars: &[char], mut i: usize, class: fn(char) -> bool) -> usize {
    while i < chars.len() && class(chars[i]) {
        i += 1;
    }
    i
}

/// The char range `[i, end)` of the pre-token that starts at char `i`.
fn next_piece(chars: &[char], i: usize) -> usize {
    if let Some(len) = contraction_len(chars, i) {
        return i + len;
    }
    // ` ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+`: the optional prefix is U+0020 only.
    let body = if chars[i] == ' ' { i + 1 } else { i };
    if let Some(&c) = chars.get(body) {
        for class in [is_letter as fn(char) -> bool, is_number, is_other] {
            if class(c) {
                return run_end(chars, body, class);
            }
        }
    }
    // `\s+(?!\S)`: the whitespace run, minus its last char when a non-space follows (so that
    // char can prefix the next word); `\s+` when that leaves nothing.
    let end = run_end(chars, i, is_space);
    if end == chars.len() || end - i == 1 {
        end
    } else {
        end - 1
    }
}

/// Splits `text` into GPT-2 pre-tokens; concatenating them gives `text` back.
pub fn split(text: &str) -> Vec<&str> {
    let chars: Vec<char> = text.chars().collect();
    let offsets: Vec<usize> = text.char_indices().map(|(o, _)| o).chain(std::iter::once(text.len())).collect();
    let mut pieces = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let end = next_piece(&chars, i);
        pieces.push(&text[offsets[i]..offsets[end]]);
        i = end;
    }
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
        assert!(split("").is_empty());
    }

    #[test]
    fn pieces_concatenate_to_the_input() {
        let text = "  Mixed\r\n text\u{a0}with 日本語, emoji 👍🏽 and 'quotes' \t\n";
        assert_eq!(split(text).concat(), text);
    }
}
