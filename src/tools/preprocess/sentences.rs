//! The rule-based sentence splitter behind `--split-sentences`.
//!
//! Megatron uses NLTK's trained punkt model; this is a deterministic stand-in, so sentence-level
//! datasets are not byte-identical to Megatron's (document-level ones are). The rules:
//!
//! * A **candidate end** is a run of terminal punctuation (`.`, `?`, `!`, `…`), followed by any
//!   closing quotes/brackets (`" ' ” ’ ) ] } »`), followed by at least one whitespace character.
//! * The candidate is a **boundary** only if the next word, after any opening quotes/brackets
//!   (`" ' “ ‘ ( [ {  «`), starts with an uppercase letter or a digit ("He left. then" is one
//!   sentence).
//! * A run made only of periods does not end a sentence after an **abbreviation**: a listed
//!   one ([`ABBREVIATIONS`], case-insensitive: `Mr.`, `Dr.`, `e.g.`, `etc.`, `Jan.` ...), a
//!   single-letter initial other than `I` (`J. R. R. Tolkien`; `I` is the pronoun), or a
//!   dotted acronym whose parts are single letters (`U.S.`, `U.S.A.`, `a.m.`).
//! * Decimals (`3.14`), version numbers and URLs never split because no whitespace follows
//!   their period.
//! * Like punkt, the first sentence starts at the start of the text, every later one at the
//!   first character of its first word, and the last one ends at the text's last
//!   non-whitespace character. Without `--keep-newlines` a sentence ends right after its
//!   closing punctuation (the whitespace between sentences is dropped); with it the whitespace
//!   that follows a sentence (newlines included) stays at the end of that sentence, as with
//!   Megatron's `CustomLanguageVars`. Newlines inside a sentence are always kept.
//! * Like `preprocess_data.py`, text is split in pieces of 1,000,000 characters, each piece on
//!   its own (a sentence never spans two pieces). Empty sentences are dropped.

/// Megatron's `max_len` for one punkt call (characters).
pub const PIECE_CHARS: usize = 1_000_000;

/// Lower-case abbreviations (without their final period) that do not end a sentence.
pub const ABBREVIATIONS: &[&str] = &[
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "ft", "vs", "etc", "e.g", "i.e", "cf", "al", "viz", "inc",
    "ltd", "co", "corp", "bros", "dept", "univ", "assn", "gov", "gen", "col", "capt", "cmdr", "lt", "sgt", "maj",
    "adm", "rev", "hon", "pres", "sen", "vol", "vols", "fig", "figs", "eq", "eqs", "ch", "pp", "eds", "approx", "ca",
    "jan", "feb", "apr", "jun", "jul", "aug", "sept", "oct", "nov", "dec", "tues", "thurs", "ave", "blvd",
];

fn is_terminal(c: char) -> bool {
    matches!(c, '.' | '?' | '!' | '…')
}

fn is_closer(c: char) -> bool {
    matches!(c, '"' | '\'' | '”' | '’' | ')' | ']' | '}' | '»')
}

fn is_opener(c: char) -> bool {
    matches!(c, '"' | '\'' | '“' | '‘' | '(' | '[' | '{' | '«')
}

/// Whether `word` (the text between the previous whitespace and a period, exclusive) is an
/// abbreviation, an initial or a dotted acronym.
pub fn is_abbreviation(word: &str) -> bool {
    let word = word.trim_start_matches(is_opener);
    let mut chars = word.chars();
    match (chars.next(), chars.next()) {
        (None, _) => false,
        (Some(c), None) => c.is_alphabetic() && c != 'I',
        _ => {
            let lower = word.to_lowercase();
            if ABBREVIATIONS.contains(&lower.as_str()) {
                return true;
            }
            // `u.s`, `u.s.a`, `a.m`: single letters joined by periods.
            word.contains('.')
                && word.split('.').all(|part| part.chars().count() == 1 && part.chars().all(char::is_alphabetic))
        }
    }
}

/// Splits `text` into sentences (see the module doc for the rules).
pub fn split_sentences(text: &str, keep_newlines: bool) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        // Byte offset of the `PIECE_CHARS`-th character (or the end).
        let cut = rest.char_indices().nth(PIECE_CHARS).map_or(rest.len(), |(i, _)| i);
        split_piece(&rest[..cut], keep_newlines, &mut out);
        rest = &rest[cut..];
    }
    out
}

fn split_piece<'a>(text: &'a str, keep_newlines: bool, out: &mut Vec<&'a str>) {
    let bytes_len = text.len();
    let mut start = 0;
    let mut iter = text.char_indices().peekable();
    while let Some((i, c)) = iter.next() {
        if !is_terminal(c) {
            continue;
        }
        // The run of terminals, then closers: `end` is the byte after them.
        let mut only_periods = c == '.';
        let mut end = i + c.len_utf8();
        while let Some(&(j, d)) = iter.peek() {
            if !is_terminal(d) {
                break;
            }
            only_periods &= d == '.';
            end = j + d.len_utf8();
            iter.next();
        }
        while let Some(&(j, d)) = iter.peek() {
            if !is_closer(d) {
                break;
            }
            end = j + d.len_utf8();
            iter.next();
        }
        // At least one whitespace character, then the next word.
        let after = &text[end..];
        let ws = after.len() - after.trim_start().len();
        if ws == 0 || ws == after.len() {
            continue;
        }
        let next_start = end + ws;
        let next_word = text[next_start..].trim_start_matches(is_opener);
        if !next_word.chars().next().is_some_and(|n| n.is_uppercase() || n.is_numeric()) {
            continue;
        }
        if only_periods {
            // The word before the periods starts after the last whitespace character.
            let word_start =
                text[..i].char_indices().rev().find(|&(_, w)| w.is_whitespace()).map_or(0, |(w, ch)| w + ch.len_utf8());
            if is_abbreviation(&text[word_start..i]) {
                continue;
            }
        }
        let stop = if keep_newlines { next_start } else { end };
        push_nonempty(out, &text[start..stop]);
        start = next_start;
    }
    push_nonempty(out, text[start..bytes_len].trim_end());
}

fn push_nonempty<'a>(out: &mut Vec<&'a str>, s: &'a str) {
    if !s.is_empty() {
        out.push(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(t: &str) -> Vec<&str> {
        split_sentences(t, false)
    }

    #[test]
    fn splits_on_terminal_punctuation_before_a_capital_or_digit() {
        assert_eq!(
            split("Hello there. How are you? Fine! 42 is the answer."),
            ["Hello there.", "How are you?", "Fine!", "42 is the answer."]
        );
        // Lower-case continuation: not a boundary.
        assert_eq!(split("He left. then he came back."), ["He left. then he came back."]);
        // Repeated terminals form one run.
        assert_eq!(split("What?! No... Yes."), ["What?!", "No...", "Yes."]);
    }

    #[test]
    fn abbreviations_initials_and_acronyms_do_not_split() {
        assert_eq!(split("Mr. Smith met Dr. Jones. They talked."), ["Mr. Smith met Dr. Jones.", "They talked."]);
        assert_eq!(split("Use tools, e.g. Hammers. Or not."), ["Use tools, e.g. Hammers.", "Or not."]);
        assert_eq!(split("J. R. R. Tolkien wrote it. Read it."), ["J. R. R. Tolkien wrote it.", "Read it."]);
        assert_eq!(split("He moved to the U.S. Then back."), ["He moved to the U.S. Then back."]);
        assert_eq!(split("So did I. Then we left."), ["So did I.", "Then we left."]);
        assert!(is_abbreviation("(Mr") && is_abbreviation("U.S.A") && !is_abbreviation("cat") && !is_abbreviation("I"));
    }

    #[test]
    fn decimals_and_quotes() {
        assert_eq!(split("Pi is 3.14 roughly. Next one."), ["Pi is 3.14 roughly.", "Next one."]);
        assert_eq!(
            split("He said \"Stop.\" Then \"Go!\" And it went."),
            ["He said \"Stop.\"", "Then \"Go!\"", "And it went."]
        );
        assert_eq!(split("(It was late.) \"Who is it?\" she asked."), ["(It was late.)", "\"Who is it?\" she asked."]);
        assert_eq!(split("It ended. “Really?” Yes."), ["It ended.", "“Really?”", "Yes."]);
    }

    #[test]
    fn whitespace_and_newlines() {
        assert_eq!(split("One.\n\nTwo.\n"), ["One.", "Two."]);
        assert_eq!(split_sentences("One.\n\nTwo.\n", true), ["One.\n\n", "Two."]);
        assert_eq!(split("A line\nwith a newline. Next."), ["A line\nwith a newline.", "Next."]);
        assert_eq!(split("   "), Vec::<&str>::new());
        assert_eq!(split(""), Vec::<&str>::new());
        assert_eq!(split("no terminal at all"), ["no terminal at all"]);
    }

    #[test]
    fn long_text_is_split_in_pieces_of_a_million_characters() {
        let text = "é".repeat(PIECE_CHARS + 5);
        let s = split(&text);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].chars().count(), s[1].chars().count()), (PIECE_CHARS, 5));
    }
}
