//! The WikiText detokenizer of Megatron's zero-shot tasks (SPEC §9.1): WikiText-103's raw
//! files are word-tokenized (`word , word`, `1 @,@ 000`, `( word )`), and the model was trained
//! on ordinary text, so the spacing is put back before tokenizing. The rules and their order
//! follow Megatron's `wikitext_detokenizer`; the bracket/quote rules are written out by hand
//! here (no regex engine needed) with the regex semantics they replace documented below.

/// Python's `\s` for `str` patterns: Unicode whitespace plus the ASCII separators 0x1c–0x1f.
fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `re.sub(r"O\s*([^C]*?)\s*C", r"O\1C", s)`: every `open` that has a `close` after it (the
/// first one) loses the whitespace just inside both ends; scanning resumes after that `close`.
/// An `open` with no `close` after it is left alone (the regex fails there and moves on).
fn collapse(s: &str, open: char, close: char) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(open) {
        let after = &rest[i + open.len_utf8()..];
        let Some(j) = after.find(close) else { break };
        out.push_str(&rest[..i]);
        out.push(open);
        out.push_str(after[..j].trim_matches(is_py_space));
        out.push(close);
        rest = &after[j + close.len_utf8()..];
    }
    out.push_str(rest);
    out
}

/// `re.sub(r"/' [0-9]/", r"/'[0-9]/", s)`: Megatron's rule replaces the matched text with the
/// literal `/'[0-9]/` (its replacement has no group); kept for identical output.
fn slash_quote_digit(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let (mut i, mut copied) = (0, 0);
    while i + 5 <= b.len() {
        if &b[i..i + 3] == b"/' " && b[i + 3].is_ascii_digit() && b[i + 4] == b'/' {
            out.push_str(&s[copied..i]);
            out.push_str("/'[0-9]/");
            i += 5;
            copied = i;
        } else {
            i += 1;
        }
    }
    out.push_str(&s[copied..]);
    out
}

/// Detokenizes WikiText-format text.
pub fn wikitext_detokenize(text: &str) -> String {
    // Contractions.
    let mut s = text.replace("s '", "s'");
    s = slash_quote_digit(&s);
    // Number separators.
    for (from, to) in [(" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", ".")] {
        s = s.replace(from, to);
    }
    // Punctuation.
    for (from, to) in [(" : ", ": "), (" ; ", "; "), (" . ", ". "), (" ! ", "! "), (" ? ", "? "), (" , ", ", ")] {
        s = s.replace(from, to);
    }
    // Brackets and quotes.
    for (open, close) in [('(', ')'), ('[', ']'), ('{', '}'), ('"', '"'), ('\'', '\'')] {
        s = collapse(&s, open, close);
    }
    // Section markers, degrees, line ends, numbers, possessives.
    for (from, to) in [
        ("= = = =", "===="),
        ("= = =", "==="),
        ("= =", "=="),
        (" \u{b0} ", "\u{b0}"),
        (" \n", "\n"),
        ("\n ", "\n"),
        (" N ", " 1 "),
        (" 's", "'s"),
    ] {
        s = s.replace(from, to);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wikitext_line() {
        let raw = " = = Early life = = \n The team 's 1 @,@ 200 @-@ seat hall ( built in 1 @.@ 5 years ) , \" opened \" ; fans ' seats . \n";
        let want = " == Early life ==\nThe team's 1,200-seat hall (built in 1.5 years), \"opened\"; fans' seats.\n";
        assert_eq!(wikitext_detokenize(raw), want);
    }

    #[test]
    fn brackets_without_a_close_are_kept() {
        assert_eq!(collapse("a ( b ( c ) d", '(', ')'), "a (b ( c) d");
        assert_eq!(collapse("x \" y", '"', '"'), "x \" y");
        assert_eq!(collapse("' a ' ' b '", '\'', '\''), "'a' 'b'");
    }

    #[test]
    fn slash_rule_is_literal() {
        assert_eq!(slash_quote_digit("a/' 7/b /' x/"), "a/'[0-9]/b /' x/");
    }
}
