//! Byte-level BPE training (`megatron tokenizer train`), producing GPT-2-format `vocab.json` +
//! `merges.txt` that [`crate::Gpt2BpeTokenizer`] and Hugging Face load.
//!
//! - Text is split at the special tokens (they are never learned from), then into GPT-2
//!   pre-tokens; the trainer works on the distinct pre-tokens with their counts.
//! - Vocabulary layout, like GPT-2's own: ids 0..255 are the 256 byte tokens in GPT-2's order
//!   (printable bytes first, i.e. ordered by their byte-to-unicode character), then one token
//!   per merge in the order learned, then the special tokens (so `<|endoftext|>` comes last).
//! - Each step merges the adjacent pair with the highest count (occurrences weighted by the
//!   pre-token's frequency). **Ties** go to the pair with the smallest left id, then the
//!   smallest right id, so the result depends only on the input, never on hashing order.
//!   Training stops at `vocab_size` tokens or when the best count is below `min_frequency`.
//! - Counts are updated incrementally: only pre-tokens containing the merged pair are
//!   revisited (an index pair → pre-tokens), and a max-heap with lazy re-validation finds the
//!   best pair.

use crate::byte_unicode::byte_to_char_table;
use crate::fast_hash::{fx_map_with_capacity, FxHashMap};
use crate::pretokenize;
use anyhow::bail;
use megatron_core::Result;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

pub use crate::bpe_train_files::count_files;

/// What to train.
#[derive(Clone, Debug)]
pub struct BpeTrainOptions {
    /// Total tokens wanted: 256 bytes + merges + special tokens.
    pub vocab_size: usize,
    /// Appended after the learned tokens, in this order (e.g. `<|endoftext|>`).
    pub special_tokens: Vec<String>,
    /// Pairs seen fewer times than this are never merged.
    pub min_frequency: u64,
}

/// Distinct pre-tokens of the training text with their counts.
#[derive(Default)]
pub struct WordCounts {
    pub(crate) counts: FxHashMap<Box<[u8]>, u64>,
    special_tokens: Vec<String>,
    bytes_seen: usize,
}

impl WordCounts {
    /// `special_tokens` are cut out of every text before pre-tokenization.
    pub fn new(special_tokens: &[String]) -> Self {
        WordCounts {
            counts: fx_map_with_capacity(1 << 14),
            special_tokens: special_tokens.iter().filter(|s| !s.is_empty()).cloned().collect(),
            bytes_seen: 0,
        }
    }

    /// Counts the pre-tokens of one document.
    pub fn add_text(&mut self, mut text: &str) {
        self.bytes_seen += text.len();
        loop {
            let next = self.special_tokens.iter().filter_map(|s| text.find(s.as_str()).map(|at| (at, s.len()))).min();
            let (chunk, rest) = match next {
                Some((at, len)) => (&text[..at], Some(&text[at + len..])),
                None => (text, None),
            };
            pretokenize::for_each_piece(chunk, |piece| match self.counts.get_mut(piece.as_bytes()) {
                Some(n) => *n += 1,
                None => {
                    self.counts.insert(piece.as_bytes().into(), 1);
                }
            });
            match rest {
                Some(r) => text = r,
                None => break,
            }
        }
    }

    /// Distinct pre-tokens seen so far.
    pub fn distinct(&self) -> usize {
        self.counts.len()
    }

    /// Bytes of text counted so far.
    pub fn bytes_seen(&self) -> usize {
        self.bytes_seen
    }
}

/// A trained vocabulary.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainedBpe {
    /// id → the bytes the token stands for (special tokens: their UTF-8).
    pub tokens: Vec<Vec<u8>>,
    /// `(left id, right id)` in rank order.
    pub merges: Vec<(u32, u32)>,
    /// Ids of the special tokens, in the order given.
    pub special_ids: Vec<u32>,
}

#[inline]
fn key(l: u32, r: u32) -> u64 {
    (u64::from(l) << 32) | u64::from(r)
}

/// Adds `delta × freq` to the count of every adjacent pair of `word`.
fn count_pairs(word: &[u32], freq: i64, counts: &mut FxHashMap<u64, i64>) {
    for w in word.windows(2) {
        *counts.entry(key(w[0], w[1])).or_insert(0) += freq;
    }
}

/// The largest vocabulary [`train_byte_level_bpe`] accepts: token ids are `i32` in the models
/// and in Megatron's int32 datasets, so a larger vocabulary could never be used.
pub const MAX_VOCAB_SIZE: usize = i32::MAX as usize;

/// Trains byte-level BPE on `counts` (see the module doc for the exact rule).
pub fn train_byte_level_bpe(counts: &WordCounts, options: &BpeTrainOptions) -> Result<TrainedBpe> {
    let specials = &options.special_tokens;
    if options.vocab_size < 256 + specials.len() {
        bail!(
            "--vocab-size {} is too small: it must hold the 256 byte tokens plus {} special token(s)",
            options.vocab_size,
            specials.len()
        );
    }
    if options.vocab_size > MAX_VOCAB_SIZE {
        bail!(
            "--vocab-size {} is too large: token ids are 32-bit signed, so at most {MAX_VOCAB_SIZE}",
            options.vocab_size
        );
    }
    let table = byte_to_char_table();
    // GPT-2's byte order: by the byte's printable stand-in character.
    let mut order: Vec<u8> = (0..=255).collect();
    order.sort_by_key(|&b| table[b as usize]);
    let mut byte_id = [0u32; 256];
    // Only what the corpus can plausibly merge is reserved up front: the requested size is a
    // ceiling, not a promise, and reserving it whole would abort on a huge --vocab-size.
    let mut tokens: Vec<Vec<u8>> = Vec::with_capacity(options.vocab_size.min(1 << 16));
    for (id, &b) in order.iter().enumerate() {
        byte_id[b as usize] = id as u32;
        tokens.push(vec![b]);
    }
    let mut token_ids: FxHashMap<Vec<u8>, u32> =
        tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();

    // Distinct pre-tokens in a fixed order (sorted bytes) so that nothing depends on hashing.
    let mut entries: Vec<(&[u8], u64)> = counts.counts.iter().map(|(w, &n)| (&w[..], n)).collect();
    entries.sort_unstable();
    let freqs: Vec<i64> = entries.iter().map(|&(_, n)| n as i64).collect();
    let mut words: Vec<Vec<u32>> =
        entries.iter().map(|&(w, _)| w.iter().map(|&b| byte_id[b as usize]).collect()).collect();
    let mut pair_counts: FxHashMap<u64, i64> = fx_map_with_capacity(1 << 16);
    let mut where_: FxHashMap<u64, Vec<u32>> = fx_map_with_capacity(1 << 16);
    for (w, word) in words.iter().enumerate() {
        count_pairs(word, freqs[w], &mut pair_counts);
        for p in word.windows(2) {
            where_.entry(key(p[0], p[1])).or_default().push(w as u32);
        }
    }
    let mut heap: BinaryHeap<(i64, Reverse<u64>)> = pair_counts.iter().map(|(&k, &n)| (n, Reverse(k))).collect();

    let target = options.vocab_size - specials.len();
    let mut merges = Vec::new();
    let (mut touched, mut dropped): (Vec<u64>, Vec<u64>) = (Vec::new(), Vec::new());
    while tokens.len() < target {
        let Some((n, Reverse(k))) = heap.pop() else { break };
        let current = pair_counts.get(&k).copied().unwrap_or(0);
        if current != n {
            // Stale entry: counts of existing pairs only ever go down, so re-queue the truth.
            if current > 0 {
                heap.push((current, Reverse(k)));
            }
            continue;
        }
        if n < options.min_frequency.max(1) as i64 {
            break;
        }
        let (l, r) = ((k >> 32) as u32, k as u32);
        let merged_bytes = [tokens[l as usize].as_slice(), tokens[r as usize].as_slice()].concat();
        // Two merges can spell the same bytes (`a bc` and `ab c`); they share one token.
        let new_id = match token_ids.get(&merged_bytes) {
            Some(&id) => id,
            None => {
                let id = tokens.len() as u32;
                token_ids.insert(merged_bytes.clone(), id);
                tokens.push(merged_bytes);
                id
            }
        };
        merges.push((l, r));
        let mut affected = where_.remove(&k).unwrap_or_default();
        affected.sort_unstable();
        affected.dedup();
        touched.clear();
        for &w in &affected {
            let word = &mut words[w as usize];
            if !word.windows(2).any(|p| p[0] == l && p[1] == r) {
                continue; // the index is allowed to be stale
            }
            let f = freqs[w as usize];
            count_pairs(word, -f, &mut pair_counts);
            dropped.extend(word.windows(2).map(|p| key(p[0], p[1])));
            let mut merged = Vec::with_capacity(word.len() - 1);
            let mut i = 0;
            while i < word.len() {
                if i + 1 < word.len() && word[i] == l && word[i + 1] == r {
                    merged.push(new_id);
                    i += 2;
                } else {
                    merged.push(word[i]);
                    i += 1;
                }
            }
            count_pairs(&merged, f, &mut pair_counts);
            for p in merged.windows(2) {
                if p[0] == new_id || p[1] == new_id {
                    let pk = key(p[0], p[1]);
                    where_.entry(pk).or_default().push(w);
                    touched.push(pk);
                }
            }
            *word = merged;
        }
        // Forget pairs that no longer occur (only those this step touched can have hit zero).
        for pk in dropped.drain(..) {
            if pair_counts.get(&pk) == Some(&0) {
                pair_counts.remove(&pk);
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for &pk in &touched {
            if let Some(&n) = pair_counts.get(&pk) {
                heap.push((n, Reverse(pk)));
            }
        }
    }

    let mut special_ids = Vec::with_capacity(specials.len());
    for s in specials {
        if token_ids.contains_key(s.as_bytes()) {
            bail!("special token {s:?} is also a learned or byte token; choose a special token that cannot occur as text (e.g. <|endoftext|>)");
        }
        let id = tokens.len() as u32;
        token_ids.insert(s.as_bytes().to_vec(), id);
        tokens.push(s.as_bytes().to_vec());
        special_ids.push(id);
    }
    Ok(TrainedBpe { tokens, merges, special_ids })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The textbook trainer: recount every pair from scratch at each step.
    fn naive(docs: &[&str], options: &BpeTrainOptions) -> Result<TrainedBpe> {
        let mut counts = WordCounts::new(&options.special_tokens);
        for d in docs {
            counts.add_text(d);
        }
        let fast = train_byte_level_bpe(&counts, options)?;
        // Start from the same byte layout (ids 0..255) and replay the rule naively.
        let byte_id = |b: u8| fast.tokens.iter().position(|t| t == &[b]).unwrap_or(0) as u32;
        let mut words: Vec<(Vec<u32>, i64)> =
            counts.counts.iter().map(|(w, &n)| (w.iter().map(|&b| byte_id(b)).collect(), n as i64)).collect();
        let mut tokens: Vec<Vec<u8>> = fast.tokens[..256].to_vec();
        let mut merges = vec![];
        while tokens.len() < options.vocab_size - options.special_tokens.len() {
            let mut pc: std::collections::BTreeMap<(u32, u32), i64> = Default::default();
            for (w, n) in &words {
                for p in w.windows(2) {
                    *pc.entry((p[0], p[1])).or_insert(0) += n;
                }
            }
            // Highest count, then smallest (left, right): BTreeMap iterates pairs ascending.
            let Some((&(l, r), &n)) = pc.iter().max_by_key(|(&p, &n)| (n, Reverse(p))) else { break };
            if n < options.min_frequency as i64 {
                break;
            }
            let bytes = [tokens[l as usize].clone(), tokens[r as usize].clone()].concat();
            let id = match tokens.iter().position(|t| t == &bytes) {
                Some(i) => i as u32,
                None => {
                    tokens.push(bytes);
                    tokens.len() as u32 - 1
                }
            };
            merges.push((l, r));
            for (w, _) in words.iter_mut() {
                let mut out = vec![];
                let mut i = 0;
                while i < w.len() {
                    if i + 1 < w.len() && (w[i], w[i + 1]) == (l, r) {
                        out.push(id);
                        i += 2;
                    } else {
                        out.push(w[i]);
                        i += 1;
                    }
                }
                *w = out;
            }
        }
        assert_eq!(fast.merges, merges, "incremental and naive trainers disagree");
        assert_eq!(fast.tokens[..tokens.len()], tokens[..]);
        Ok(fast)
    }

    #[test]
    fn incremental_counts_match_recounting() -> Result<()> {
        let opts =
            |v| BpeTrainOptions { vocab_size: v, special_tokens: vec!["<|endoftext|>".into()], min_frequency: 1 };
        naive(&["aaaa aaa aa a", "abab baba abba <|endoftext|> abab"], &opts(270))?;
        naive(&["the cat sat on the mat; the hat sat on the cat", "  théâtre 日本語日本語 ..."], &opts(300))?;
        // A seeded pseudo-random corpus over a small alphabet (many ties and overlaps).
        let mut state = 7u64;
        let mut doc = String::new();
        for _ in 0..3000 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            doc.push(b"abc  de\n"[(state >> 33) as usize % 8] as char);
        }
        let t = naive(&[&doc], &opts(400))?;
        assert_eq!(t.special_ids, [t.tokens.len() as u32 - 1]);
        Ok(())
    }

    #[test]
    fn layout_and_file_formats_follow_gpt2() -> Result<()> {
        let mut counts = WordCounts::new(&["<|endoftext|>".to_string()]);
        counts.add_text("hello hello hello<|endoftext|>help");
        let t = train_byte_level_bpe(
            &counts,
            &BpeTrainOptions { vocab_size: 262, special_tokens: vec!["<|endoftext|>".into()], min_frequency: 2 },
        )?;
        // GPT-2's first byte tokens: '!' = 0, '"' = 1; space (Ġ) after the printable ones.
        assert_eq!((t.tokens[0].as_slice(), t.tokens[1].as_slice()), (&b"!"[..], &b"\""[..]));
        assert_eq!(t.tokens[188], b"\0");
        let merges = t.merges_txt();
        assert!(merges.starts_with("#version: 0.2\n"), "{merges}");
        // `h e` and `e l` both occur 4 times: the tie goes to the smaller left id ('e' < 'h').
        assert_eq!(merges.lines().nth(1), Some("e l"));
        let vocab: serde_json::Value = serde_json::from_str(&t.vocab_json())?;
        assert_eq!(vocab["!"], 0);
        assert_eq!(vocab["<|endoftext|>"], t.tokens.len() - 1);
        assert!(t.tokens.len() <= 262);
        assert!(train_byte_level_bpe(
            &counts,
            &BpeTrainOptions { vocab_size: 256, special_tokens: vec!["x".into()], min_frequency: 1 }
        )
        .is_err());
        Ok(())
    }
}
