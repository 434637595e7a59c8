//! Batched and chunked prefill: which prompt tokens the next engine step feeds, and how they
//! are packed into model calls.
//!
//! Every step the loop prefills at most [`crate::EngineConfig::prefill_tokens`] prompt tokens,
//! first come first served: the oldest prefilling sequence takes what it still needs (up to the
//! budget), the next one what is left, and so on. A prompt longer than the budget is therefore
//! split into chunks, one per step, with a decode step of the running sequences in between:
//! their inter-token latency stays bounded by one chunk, not by a whole long prompt.
//!
//! The chunks of one step are packed into as few `forward_slots_with` calls as possible: one
//! call is `(B, Tq)`, so the rows of a call are padded to its longest chunk. Rows are sorted
//! longest first and a row joins the current call only while the padding stays within
//! [`MAX_PADDING`] of the real tokens (padding costs compute; an extra call costs one more read
//! of every weight). Rotary models need one offset per call, so their rows are grouped by
//! offset first (fresh prompts all start at 0). A call never runs a row past its slot.

/// Padding allowed in one call, as a fraction of its real tokens.
pub const MAX_PADDING: f64 = 0.25;

/// One sequence that still has prompt tokens to feed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pending {
    pub slot: usize,
    /// Prompt tokens already in the slot (= the slot's cached length).
    pub offset: usize,
    /// Prompt tokens not yet fed.
    pub remaining: usize,
    /// Admission order (smaller = older).
    pub order: u64,
}

/// One chunk: `len` prompt tokens of `slot`, starting at prompt position `start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub slot: usize,
    pub start: usize,
    pub len: usize,
}

/// One model call: its rows (chunks) and their padded length `Tq`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub rows: Vec<Chunk>,
    pub tq: usize,
}

/// The calls that feed this step's prompt chunks: at most `budget` real tokens (at least one
/// chunk whatever the budget), `capacity` tokens per slot, `rope`: one offset per call.
pub fn plan(pending: &[Pending], budget: usize, capacity: usize, rope: bool) -> Vec<Call> {
    let mut order: Vec<Pending> = pending.iter().copied().filter(|p| p.remaining > 0).collect();
    order.sort_by_key(|p| (p.order, p.slot));
    let mut left = budget.max(1);
    let mut chunks = Vec::new();
    for p in order {
        if left == 0 {
            break;
        }
        let len = p.remaining.min(left);
        left -= len;
        chunks.push(Chunk { slot: p.slot, start: p.offset, len });
    }
    // Longest first; with rotary embeddings, one offset per call.
    chunks.sort_by_key(|c| (if rope { c.start } else { 0 }, std::cmp::Reverse(c.len), c.slot));
    let mut calls: Vec<Call> = Vec::new();
    for c in chunks {
        if let Some(call) = calls.last_mut() {
            let same_offset = !rope || call.rows[0].start == c.start;
            let real: usize = call.rows.iter().map(|r| r.len).sum::<usize>() + c.len;
            let padded = (call.rows.len() + 1) * call.tq;
            let fits = c.start + call.tq <= capacity;
            if same_offset && fits && (padded - real) as f64 <= MAX_PADDING * real as f64 {
                call.rows.push(c);
                continue;
            }
        }
        calls.push(Call { rows: vec![c], tq: c.len });
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(slot: usize, offset: usize, remaining: usize, order: u64) -> Pending {
        Pending { slot, offset, remaining, order }
    }

    fn real(calls: &[Call]) -> usize {
        calls.iter().flat_map(|c| &c.rows).map(|r| r.len).sum()
    }

    #[test]
    fn budget_is_first_come_first_served_and_splits_long_prompts() {
        // Slot 3 came first: it takes 10 of its 50 tokens when the budget is 10.
        let calls = plan(&[p(0, 0, 5, 2), p(3, 0, 50, 1)], 10, 64, false);
        assert_eq!(calls, vec![Call { rows: vec![Chunk { slot: 3, start: 0, len: 10 }], tq: 10 }]);
        // The next step continues it at position 10, and slot 0 gets the rest of the budget.
        let calls = plan(&[p(0, 0, 5, 2), p(3, 10, 40, 1)], 45, 64, false);
        assert_eq!(real(&calls), 45);
        assert!(calls.iter().flat_map(|c| &c.rows).any(|r| *r == Chunk { slot: 3, start: 10, len: 40 }));
        // A zero budget still makes progress.
        assert_eq!(real(&plan(&[p(1, 0, 3, 0)], 0, 64, false)), 1);
        assert!(plan(&[p(1, 0, 0, 0)], 8, 64, false).is_empty());
    }

    #[test]
    fn similar_lengths_share_a_call_and_padding_is_bounded() {
        let pending: Vec<Pending> = [20, 19, 18, 4, 3].iter().enumerate().map(|(i, &n)| p(i, 0, n, i as u64)).collect();
        let calls = plan(&pending, 1000, 64, false);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].tq, 20);
        assert_eq!(calls[0].rows.iter().map(|r| r.slot).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(calls[1].tq, 4);
        for c in &calls {
            let r: usize = c.rows.iter().map(|r| r.len).sum();
            assert!((c.rows.len() * c.tq - r) as f64 <= MAX_PADDING * r as f64);
            assert!(c.rows.iter().all(|r| r.len <= c.tq));
        }
        assert_eq!(real(&calls), 64);
    }

    #[test]
    fn rotary_calls_share_one_offset_and_rows_fit_their_slots() {
        let calls = plan(&[p(0, 0, 8, 0), p(1, 8, 8, 1), p(2, 0, 8, 2)], 100, 64, true);
        assert_eq!(calls.len(), 2);
        for c in &calls {
            assert!(c.rows.iter().all(|r| r.start == c.rows[0].start));
        }
        // Without rotary embeddings the offsets may differ: one call.
        assert_eq!(plan(&[p(0, 0, 8, 0), p(1, 8, 8, 1), p(2, 0, 8, 2)], 100, 64, false).len(), 1);
        // Slot 1 at offset 60 of 64 cannot be padded to 8 tokens: its own call.
        let calls = plan(&[p(0, 0, 8, 0), p(1, 60, 4, 1), p(2, 0, 8, 2), p(3, 0, 8, 3)], 100, 64, false);
        for c in &calls {
            assert!(c.rows.iter().all(|r| r.start + c.tq <= 64));
        }
        assert_eq!(real(&calls), 28);
    }
}
