//! Megatron's masked-LM predictions (SPEC §2.11, `_create_masked_lm_predictions` with the
//! `pretrain_bert.py` settings: whole-word n-grams up to 3 with `P(n) ∝ 1/n`, no permutation,
//! no geometric lengths) and BERT's 80/10/10 replacement, drawing from the sample's numpy
//! `RandomState` in Megatron's order.

use super::rng::NumpyDraws;
use crate::gpt::RandomState;
use std::collections::HashSet;

/// What the masking needs to know about the vocabulary.
#[derive(Clone, Debug)]
pub struct MaskingVocab {
    /// `is_subword[id]`: the token string starts with `##` (continues a word).
    pub is_subword: Vec<bool>,
    pub cls: i64,
    pub sep: i64,
    pub mask: i64,
}

/// Masking options (`--mask-prob`, `masking_max_ngram`, `masking_do_full_word`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MaskingConfig {
    pub probability: f64,
    pub max_ngram: usize,
    pub full_word: bool,
}

/// The masked tokens and the sorted `(position, original id)` of every masked position.
pub struct Masked {
    pub tokens: Vec<i64>,
    pub positions: Vec<usize>,
    pub labels: Vec<i64>,
}

/// Whole-word candidates: lists of positions, `[CLS]`/`[SEP]` never included.
fn candidates(tokens: &[i64], v: &MaskingVocab, full_word: bool) -> Vec<Vec<usize>> {
    let mut c: Vec<Vec<usize>> = Vec::new();
    for (i, &t) in tokens.iter().enumerate() {
        if t == v.cls || t == v.sep {
            continue;
        }
        let sub = v.is_subword.get(t as usize).copied().unwrap_or(false);
        match c.last_mut() {
            Some(last) if sub && full_word => last.push(i),
            _ => c.push(vec![i]),
        }
    }
    c
}

/// `_get_token_mask`: 80% `[MASK]`, 10% a random id in `[0, vocab)`, 10% unchanged (`None`).
fn replacement(rng: &mut RandomState, v: &MaskingVocab) -> Option<i64> {
    if rng.random() < 0.8 {
        return Some(v.mask);
    }
    if rng.random() >= 0.5 {
        return Some(rng.randint(0, v.is_subword.len() as i64));
    }
    None
}

/// Masks `tokens` (`[CLS] A [SEP] (B [SEP])`) of a sample with target length `target_len`.
pub fn create_masked_lm_predictions(
    tokens: &[i64],
    target_len: u64,
    cfg: &MaskingConfig,
    v: &MaskingVocab,
    rng: &mut RandomState,
) -> Masked {
    let cands = candidates(tokens, v, cfg.full_word);
    // Python: min(p * target, max(1, int(round(len * p)))) with round half to even.
    let by_len = ((tokens.len() as f64 * cfg.probability).round_ties_even() as i64).max(1) as f64;
    let n_maskings = (cfg.probability * target_len as f64).min(by_len);
    // P(n) ∝ 1/n, normalised twice as Megatron does (once globally, once per candidate).
    let inv: Vec<f64> = (1..=cfg.max_ngram).map(|n| 1.0 / n as f64).collect();
    let s: f64 = inv.iter().sum();
    let nprobs: Vec<f64> = inv.iter().map(|p| p / s).collect();
    let s2: f64 = nprobs.iter().sum();
    let p: Vec<f64> = nprobs.iter().map(|q| q / s2).collect();
    // The per-start n-gram lists are shuffled as a whole: shuffle their start indices.
    let mut order: Vec<usize> = (0..cands.len()).collect();
    rng.shuffle(&mut order);
    let ngram = |start: usize, n: usize| -> Vec<usize> {
        cands[start..(start + n).min(cands.len())].iter().flatten().copied().collect()
    };
    let mut out = tokens.to_vec();
    let mut picked: Vec<(usize, i64)> = Vec::new();
    let mut masked: HashSet<usize> = HashSet::new();
    for &start in &order {
        if picked.len() as f64 >= n_maskings {
            break;
        }
        let mut n = rng.choice_p(&p) + 1;
        let indices = loop {
            let idx = ngram(start, n);
            n -= 1;
            if n_maskings >= (picked.len() + idx.len()) as f64 {
                break Some(idx);
            }
            if n == 0 {
                break None;
            }
        };
        let Some(indices) = indices else { continue };
        if indices.iter().any(|i| masked.contains(i)) {
            continue;
        }
        for &i in &indices {
            masked.insert(i);
            if let Some(r) = replacement(rng, v) {
                out[i] = r;
            }
            picked.push((i, tokens[i]));
        }
    }
    // (Megatron shuffles the candidate list once more here; nothing reads the rng afterwards.)
    picked.sort_by_key(|&(i, _)| i);
    Masked {
        tokens: out,
        positions: picked.iter().map(|p| p.0).collect(),
        labels: picked.iter().map(|p| p.1).collect(),
    }
}
