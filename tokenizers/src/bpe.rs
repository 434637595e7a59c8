//! The byte-level BPE merge step shared by the GPT-2 tokenizer and the BPE trainer's output:
//! a merge-rank table keyed by the id pair and a bounded per-tokenizer cache of finished
//! pre-tokens (real text repeats a few thousand words over and over).

use crate::fast_hash::{fx_map_with_capacity, FxHashMap};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Mutex;

/// Pre-tokens cached before the cache is cleared (bounds memory on huge corpora).
const CACHE_CAPACITY: usize = 1 << 18;
/// Longer pre-tokens are not cached (rare, and they would crowd out the common ones).
const CACHE_MAX_PIECE: usize = 64;
/// "No merge" rank.
const NONE: u32 = u32::MAX;
/// Longer pre-tokens merge with a heap (O(n log n)) instead of rescanning (O(n²)).
const SCAN_MAX_LEN: usize = 128;

#[inline]
fn pair_key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

/// Merge ranks plus the byte → id map: everything needed to turn a pre-token into ids.
pub struct BytePairModel {
    /// `(left id, right id)` packed by [`pair_key`] → `(merge rank, merged id)`.
    merges: FxHashMap<u64, (u32, u32)>,
    /// byte → id of its single-byte token.
    byte_ids: [u32; 256],
    /// Finished pre-tokens. Locked with `try_lock`: under contention a thread just merges
    /// without the cache instead of waiting.
    cache: Mutex<PieceCache>,
}

/// Pre-token bytes → its ids.
type PieceCache = FxHashMap<Box<[u8]>, Box<[u32]>>;

impl BytePairModel {
    /// `merges[rank] = (left, right, merged)`; a repeated pair keeps its last rank (like
    /// Python's `dict(zip(merges, range(...)))`).
    pub fn new(byte_ids: [u32; 256], merges: &[(u32, u32, u32)]) -> Self {
        let mut table = fx_map_with_capacity(merges.len());
        for (rank, &(l, r, m)) in merges.iter().enumerate() {
            table.insert(pair_key(l, r), (rank as u32, m));
        }
        BytePairModel { merges: table, byte_ids, cache: Mutex::new(fx_map_with_capacity(1024)) }
    }

    #[inline]
    fn rank(&self, left: u32, right: u32) -> u32 {
        self.merges.get(&pair_key(left, right)).map_or(NONE, |&(rank, _)| rank)
    }

    /// Merges one pre-token's bytes, lowest rank first, leftmost first among equal ranks (the
    /// order of OpenAI's `bpe()`, tiktoken and Hugging Face for any well-formed merge list),
    /// appending the ids to `out`.
    pub fn merge_word(&self, bytes: &[u8], out: &mut Vec<u32>) {
        if bytes.len() == 1 {
            out.push(self.byte_ids[bytes[0] as usize]);
            return;
        }
        if bytes.len() > SCAN_MAX_LEN {
            return self.merge_long_word(bytes, out);
        }
        let mut ids: Vec<u32> = bytes.iter().map(|&b| self.byte_ids[b as usize]).collect();
        // ranks[i] = rank of the pair (ids[i], ids[i+1]).
        let mut ranks: Vec<u32> = ids.windows(2).map(|w| self.rank(w[0], w[1])).collect();
        loop {
            let mut best = NONE;
            let mut at = 0;
            for (i, &r) in ranks.iter().enumerate() {
                if r < best {
                    best = r;
                    at = i;
                }
            }
            if best == NONE {
                break;
            }
            let merged = self.merges.get(&pair_key(ids[at], ids[at + 1])).map_or(ids[at], |&(_, m)| m);
            ids[at] = merged;
            ids.remove(at + 1);
            ranks.remove(at);
            if at + 1 < ids.len() {
                ranks[at] = self.rank(ids[at], ids[at + 1]);
            }
            if at > 0 {
                ranks[at - 1] = self.rank(ids[at - 1], ids[at]);
            }
        }
        out.extend_from_slice(&ids);
    }

    /// [`Self::merge_word`] for long pre-tokens (e.g. a megabyte of letters without a space):
    /// symbols in a doubly linked list, candidate merges in a min-heap ordered by (rank,
    /// position), stale candidates skipped when popped. Same merge order as the scan.
    fn merge_long_word(&self, bytes: &[u8], out: &mut Vec<u32>) {
        let n = bytes.len();
        let mut ids: Vec<u32> = bytes.iter().map(|&b| self.byte_ids[b as usize]).collect();
        let mut alive = vec![true; n];
        // prev/next symbol index; `n` = none.
        let mut prev: Vec<usize> = (0..n).map(|i| if i == 0 { n } else { i - 1 }).collect();
        let mut next: Vec<usize> = (1..=n).collect();
        let mut heap = BinaryHeap::with_capacity(n);
        for i in 0..n - 1 {
            let r = self.rank(ids[i], ids[i + 1]);
            if r != NONE {
                heap.push(Reverse((r, i)));
            }
        }
        while let Some(Reverse((rank, i))) = heap.pop() {
            let j = next[i];
            // Skip candidates whose symbols have changed since they were queued.
            if !alive[i] || j >= n || self.rank(ids[i], ids[j]) != rank {
                continue;
            }
            ids[i] = self.merges.get(&pair_key(ids[i], ids[j])).map_or(ids[i], |&(_, m)| m);
            alive[j] = false;
            next[i] = next[j];
            if next[j] < n {
                prev[next[j]] = i;
            }
            if prev[i] < n {
                let r = self.rank(ids[prev[i]], ids[i]);
                if r != NONE {
                    heap.push(Reverse((r, prev[i])));
                }
            }
            if next[i] < n {
                let r = self.rank(ids[i], ids[next[i]]);
                if r != NONE {
                    heap.push(Reverse((r, i)));
                }
            }
        }
        out.extend((0..n).filter(|&i| alive[i]).map(|i| ids[i]));
    }

    /// [`Self::merge_word`] through the cache.
    #[inline]
    pub fn encode_piece(&self, piece: &[u8], out: &mut Vec<u32>) {
        if piece.len() == 1 || piece.len() > CACHE_MAX_PIECE {
            return self.merge_word(piece, out);
        }
        let Ok(mut cache) = self.cache.try_lock() else {
            return self.merge_word(piece, out);
        };
        if let Some(ids) = cache.get(piece) {
            out.extend_from_slice(ids);
            return;
        }
        let start = out.len();
        self.merge_word(piece, out);
        if cache.len() >= CACHE_CAPACITY {
            cache.clear();
        }
        cache.insert(piece.into(), out[start..].into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes map to themselves; merges: a b → 256, 256 c → 257, a a → 258.
    fn toy() -> BytePairModel {
        let mut byte_ids = [0u32; 256];
        for (b, id) in byte_ids.iter_mut().enumerate() {
            *id = b as u32;
        }
        let (a, b, c) = (u32::from(b'a'), u32::from(b'b'), u32::from(b'c'));
        BytePairModel::new(byte_ids, &[(a, b, 256), (256, c, 257), (a, a, 258)])
    }

    /// The textbook algorithm: repeatedly merge every occurrence of the lowest-ranked pair.
    fn naive(model: &BytePairModel, bytes: &[u8]) -> Vec<u32> {
        let mut word: Vec<u32> = bytes.iter().map(|&b| u32::from(b)).collect();
        loop {
            let best = word.windows(2).map(|w| model.rank(w[0], w[1])).min().unwrap_or(NONE);
            if best == NONE {
                return word;
            }
            let mut next = vec![];
            let mut i = 0;
            while i < word.len() {
                if i + 1 < word.len() && model.rank(word[i], word[i + 1]) == best {
                    next.push(model.merges[&pair_key(word[i], word[i + 1])].1);
                    i += 2;
                } else {
                    next.push(word[i]);
                    i += 1;
                }
            }
            word = next;
        }
    }

    #[test]
    fn merge_order_matches_the_naive_algorithm() {
        let m = toy();
        for w in ["abc", "aaa", "aaaa", "abcabc", "aabc", "cab", "x", "ababababcc", "aaabcaab"] {
            let mut out = vec![];
            m.merge_word(w.as_bytes(), &mut out);
            assert_eq!(out, naive(&m, w.as_bytes()), "{w}");
            let mut cached = vec![7];
            m.encode_piece(w.as_bytes(), &mut cached);
            m.encode_piece(w.as_bytes(), &mut cached);
            assert_eq!(cached[1..], [out.clone(), out].concat()[..], "{w} via cache");
        }
        let mut out = vec![];
        m.merge_word(b"abc", &mut out);
        assert_eq!(out, [257]);
    }

    #[test]
    fn heap_merge_of_long_words_matches_the_scan() {
        let m = toy();
        let mut state = 11u64;
        for len in [2, 3, 17, 129, 400, 1000] {
            let word: Vec<u8> = (0..len)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    b"aabcx"[(state >> 33) as usize % 5]
                })
                .collect();
            let (mut heap, mut scan) = (vec![], vec![]);
            m.merge_long_word(&word, &mut heap);
            // The scan path directly (merge_word would route long words to the heap).
            let mut ids: Vec<u32> = word.iter().map(|&b| u32::from(b)).collect();
            loop {
                let best = (0..ids.len().saturating_sub(1)).map(|i| (m.rank(ids[i], ids[i + 1]), i)).min();
                let Some((_, i)) = best.filter(|&(r, _)| r != NONE) else { break };
                ids[i] = m.merges[&pair_key(ids[i], ids[i + 1])].1;
                ids.remove(i + 1);
            }
            scan.extend(ids);
            assert_eq!(heap, scan, "length {len}");
            assert_eq!(heap, naive(&m, &word), "length {len} vs naive");
        }
    }
}
