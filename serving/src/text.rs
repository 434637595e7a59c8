//! The text of one streamed choice: incremental detokenization (decode the growing id list,
//! hand out only the new suffix, wait while it ends in an incomplete UTF-8 character) and stop
//! sequences (the text is cut before the first one, and text that might be the start of one is
//! held back until it is known not to be).

use megatron_core::Tokenizer;

/// Accumulates the generated ids of one choice.
pub struct TextStream {
    ids: Vec<u32>,
    text: String,
    /// Bytes of `text` already handed out.
    emitted: usize,
    stops: Vec<String>,
    /// A stop sequence was found; `text` ends before it.
    pub stopped: bool,
}

impl TextStream {
    pub fn new(stops: &[String]) -> TextStream {
        let stops = stops.iter().filter(|s| !s.is_empty()).cloned().collect();
        TextStream { ids: Vec::new(), text: String::new(), emitted: 0, stops, stopped: false }
    }

    /// The text so far (cut before a stop sequence once one was found).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Adds one generated id; returns the text that became final (possibly empty).
    pub fn push(&mut self, tok: &dyn Tokenizer, id: i32) -> String {
        if self.stopped {
            return String::new();
        }
        self.ids.push(id.max(0) as u32);
        let full = tok.decode(&self.ids).unwrap_or_default();
        if full.ends_with('\u{FFFD}') {
            return String::new(); // the rest of a multi-byte character is still to come
        }
        self.text = full;
        let found = self.stops.iter().filter_map(|s| self.text.find(s.as_str())).min();
        if let Some(at) = found {
            self.text.truncate(at);
            self.stopped = true;
            return self.take(self.text.len());
        }
        // Hold back the longest suffix that is a proper prefix of a stop sequence.
        let hold = self
            .stops
            .iter()
            .flat_map(|s| (1..s.len()).filter(|&k| s.is_char_boundary(k)).map(move |k| &s[..k]))
            .filter(|p| self.text.ends_with(p))
            .map(str::len)
            .max()
            .unwrap_or(0);
        self.take(self.text.len() - hold)
    }

    /// Everything not handed out yet (the choice ended without a stop sequence).
    pub fn finish(&mut self) -> String {
        self.take(self.text.len())
    }

    fn take(&mut self, end: usize) -> String {
        // Earlier text can change when a later id is decoded with it (rare); hand out what is new.
        if end <= self.emitted || !self.text.is_char_boundary(self.emitted) || !self.text.is_char_boundary(end) {
            return String::new();
        }
        let out = self.text[self.emitted..end].to_string();
        self.emitted = end;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use megatron_core::{Result, SpecialIds};

    /// Id i decodes to the i-th piece.
    struct Pieces(Vec<&'static str>);
    impl Tokenizer for Pieces {
        fn name(&self) -> &str {
            "pieces"
        }
        fn vocab_size(&self) -> usize {
            self.0.len()
        }
        fn encode(&self, _: &str) -> Result<Vec<u32>> {
            Ok(Vec::new())
        }
        fn decode(&self, ids: &[u32]) -> Result<String> {
            Ok(ids.iter().map(|&i| self.0[i as usize]).collect())
        }
        fn special_ids(&self) -> SpecialIds {
            SpecialIds::default()
        }
        fn fingerprint(&self) -> String {
            String::new()
        }
    }

    #[test]
    fn stop_sequences_cut_and_hold_back() {
        let t = Pieces(vec!["Hello", " wor", "ld", "\n", "\nBye", "X"]);
        let mut s = TextStream::new(&["\n\n".to_string()]);
        let out: Vec<String> = [0, 1, 2, 3, 4, 5].iter().map(|&i| s.push(&t, i)).collect();
        // "\n" is held (it may start "\n\n"), then "\n\n" is found and everything after is cut.
        assert_eq!(out, vec!["Hello", " wor", "ld", "", "", ""]);
        assert!(s.stopped);
        assert_eq!(s.text(), "Hello world");
        let mut s = TextStream::new(&["\n\n".to_string()]);
        assert_eq!((s.push(&t, 3), s.push(&t, 5), s.finish()), ("".into(), "\nX".into(), "".into()));
        let mut s = TextStream::new(&[]);
        assert_eq!((s.push(&t, 3), s.finish()), ("\n".into(), "".into()));
    }
}
