//! T5 span corruption (SPEC §2.12): Megatron's `_create_masked_lm_predictions` with whole-word
//! candidates, SpanBERT n-gram lengths `min(Geometric(0.2), max_ngram)` and every masked token
//! `[MASK]`, then the encoder input with one sentinel per span and the decoder input/output.

use super::rng::geometric;
use crate::gpt::RandomState;

/// What the masking needs to know about the vocabulary.
#[derive(Clone, Debug)]
pub struct T5Vocab {
    /// Per id: its vocabulary string starts with `##` (a word continuation).
    pub continuation: Vec<bool>,
    pub cls: i64,
    pub sep: i64,
    pub mask: i64,
    pub pad: i64,
    pub bos: i64,
    pub eos: i64,
    /// `<extra_id_0>`, `<extra_id_1>`, ... in order.
    pub sentinels: Vec<i64>,
}

/// One masked span: its positions (consecutive) and their original ids.
pub type Span = (Vec<usize>, Vec<i64>);

/// The masked spans of `tokens`, sorted by first position (the masked token ids themselves
/// are not needed: T5 rebuilds the encoder input from the spans).
pub fn masked_spans(
    tokens: &[i64],
    target_len: usize,
    vocab: &T5Vocab,
    masking_probability: f64,
    max_ngram: usize,
    rng: &mut RandomState,
) -> Vec<Span> {
    // Whole-word candidates: a word start opens a candidate, `##` pieces join the last one.
    let mut candidates: Vec<Vec<usize>> = Vec::new();
    for (i, &t) in tokens.iter().enumerate() {
        if t == vocab.cls || t == vocab.sep {
            continue;
        }
        let cont = vocab.continuation.get(t as usize).copied().unwrap_or(false);
        match candidates.last_mut() {
            Some(last) if cont => last.push(i),
            _ => candidates.push(vec![i]),
        }
    }
    // Python's `round` rounds halves to even (round(4.5) == 4).
    let n_maskings = (masking_probability * target_len as f64)
        .min(((tokens.len() as f64 * masking_probability).round_ties_even() as i64).max(1) as f64);
    // Per start candidate, its n-grams for n = 1..=max_ngram (shorter near the end).
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    rng.shuffle(&mut order);
    let mut masked = vec![false; tokens.len()];
    let mut n_masked = 0usize;
    let mut spans: Vec<Span> = Vec::new();
    for &c in &order {
        if n_masked as f64 >= n_maskings {
            break;
        }
        let mut n = (geometric(rng, 0.2) as usize).min(max_ngram);
        let indices: Vec<usize> = loop {
            let end = (c + n).min(candidates.len());
            let idx: Vec<usize> = candidates[c..end].iter().flatten().copied().collect();
            n -= 1;
            if n_maskings >= (n_masked + idx.len()) as f64 {
                break idx;
            }
            if n == 0 {
                break Vec::new();
            }
        };
        if indices.is_empty() || indices.iter().any(|&i| masked[i]) {
            continue;
        }
        for &i in &indices {
            masked[i] = true;
        }
        n_masked += indices.len();
        let labels = indices.iter().map(|&i| tokens[i]).collect();
        spans.push((indices, labels));
    }
    // Megatron shuffles the candidates once more here (for permutation, off for T5): keep the
    // stream in step.
    rng.shuffle(&mut order);
    spans.sort_by_key(|s| s.0[0]);
    spans
}

/// A T5 sample as Megatron's `T5MaskedWordPieceDataset.__getitem__` returns it.
#[derive(Clone, Debug, PartialEq)]
pub struct T5Sample {
    /// `(S_enc)`, 0 at padding.
    pub text_enc: Vec<i64>,
    /// `(S_dec)`, `[bos]` first, 0 at padding.
    pub text_dec: Vec<i64>,
    /// `(S_dec)`, -1 at padding.
    pub labels: Vec<i64>,
    /// 1 on the first `len(decoder_input)` positions.
    pub loss_mask: Vec<i64>,
    pub truncated: bool,
    pub enc_mask: Vec<i64>,
    pub dec_mask: Vec<i64>,
}

/// Builds the sample from the concatenated (already truncated) tokens and their spans.
/// `None` when the result does not fit `enc_len`/`dec_len` or the sentinels run out.
pub fn build_sample(
    tokens: &[i64],
    spans: &[Span],
    vocab: &T5Vocab,
    enc_len: usize,
    dec_len: usize,
    truncated: bool,
) -> Option<T5Sample> {
    let mut enc = Vec::with_capacity(enc_len);
    let mut dec_in = vec![vocab.bos];
    let mut dec_out = Vec::new();
    let mut beg = 0usize;
    for (k, (indices, labels)) in spans.iter().enumerate() {
        let s = *vocab.sentinels.get(k)?;
        enc.extend_from_slice(&tokens[beg..indices[0]]);
        enc.push(s);
        dec_in.push(s);
        dec_in.extend_from_slice(labels);
        dec_out.push(s);
        dec_out.extend_from_slice(labels);
        beg = indices[indices.len() - 1] + 1;
    }
    enc.extend_from_slice(&tokens[beg..]);
    dec_out.push(vocab.eos);
    if enc.len() > enc_len || dec_in.len() > dec_len {
        return None;
    }
    let nd = dec_in.len();
    enc.resize(enc_len, vocab.pad);
    dec_in.resize(dec_len, vocab.pad);
    dec_out.resize(dec_len, -1);
    let enc_mask = enc.iter().map(|&t| i64::from(t != vocab.pad)).collect();
    let dec_mask = dec_in.iter().map(|&t| i64::from(t != vocab.pad)).collect();
    let zero_pad = |v: Vec<i64>| v.into_iter().map(|t| if t == vocab.pad { 0 } else { t }).collect::<Vec<_>>();
    let loss_mask = (0..dec_len).map(|i| i64::from(i < nd)).collect();
    Some(T5Sample {
        text_enc: zero_pad(enc),
        text_dec: zero_pad(dec_in),
        labels: zero_pad(dec_out),
        loss_mask,
        truncated,
        enc_mask,
        dec_mask,
    })
}
