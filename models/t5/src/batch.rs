//! The packed T5 sample/batch layout. `megatron_core::Batch` (and `Sample`) carry one token
//! row per sample; a T5 sample has an encoder and a decoder part, so the row of length
//! `S_enc + S_dec` is the two parts side by side:
//!
//! | field       | positions `0..S_enc`                  | positions `S_enc..S_enc+S_dec`       |
//! |-------------|---------------------------------------|--------------------------------------|
//! | `tokens`    | encoder input (`text_enc`)            | decoder input (`text_dec`)           |
//! | `labels`    | unused (0)                            | decoder targets (`labels`, 0 at pad) |
//! | `loss_mask` | encoder padding mask (`enc_mask`)     | `loss_mask` (= `dec_mask`)           |
//!
//! Padding is on the right (Megatron's T5 samples): the encoder's valid length is the number
//! of ones in its mask (which must be a prefix), the decoder's is one past its last
//! non-zero `loss_mask` entry.

use anyhow::{bail, Result};
use megatron_core::{Batch, Sample};

/// One microbatch split into its encoder and decoder parts.
#[derive(Clone, Debug, PartialEq)]
pub struct T5Batch {
    pub batch: usize,
    pub enc_seq: usize,
    pub dec_seq: usize,
    /// `(B, S_enc)`.
    pub enc_tokens: Vec<i32>,
    /// `(B, S_dec)`.
    pub dec_tokens: Vec<i32>,
    /// `(B, S_dec)`, valid vocabulary ids everywhere (0 at padding).
    pub labels: Vec<i32>,
    /// `(B, S_dec)`.
    pub loss_mask: Vec<f32>,
    pub enc_len: Vec<usize>,
    pub dec_len: Vec<usize>,
}

/// Packs one T5 sample into the layout above.
pub fn pack_sample(enc: &[i32], dec: &[i32], labels: &[i32], loss_mask: &[f32], enc_mask: &[f32]) -> Sample {
    let tokens = enc.iter().chain(dec).copied().collect();
    let labels = std::iter::repeat_n(0, enc.len()).chain(labels.iter().map(|&l| l.max(0))).collect();
    let loss_mask = enc_mask.iter().chain(loss_mask).copied().collect();
    Sample { tokens, labels, loss_mask }
}

impl T5Batch {
    /// Splits a packed batch; errors name the field and the expected layout.
    pub fn unpack(b: &Batch, enc_seq: usize, dec_seq: usize) -> Result<T5Batch> {
        let (mbs, s) = (b.micro_batch_size, b.seq_length);
        if s != enc_seq + dec_seq {
            bail!(
                "t5 batch: rows of {s} tokens, expected --encoder-seq-length {enc_seq} + --decoder-seq-length {dec_seq} \
                 (the packed T5 layout; use a T5 dataset)"
            );
        }
        let n = mbs * s;
        if b.tokens.len() != n || b.labels.len() != n || b.loss_mask.len() != n {
            bail!("t5 batch: tokens/labels/loss_mask must hold {mbs} x {s} = {n} entries");
        }
        let mut t = T5Batch {
            batch: mbs,
            enc_seq,
            dec_seq,
            enc_tokens: vec![],
            dec_tokens: vec![],
            labels: vec![],
            loss_mask: vec![],
            enc_len: vec![],
            dec_len: vec![],
        };
        for r in 0..mbs {
            let row = r * s..(r + 1) * s;
            let (tok, lab, mask) = (&b.tokens[row.clone()], &b.labels[row.clone()], &b.loss_mask[row]);
            t.enc_tokens.extend_from_slice(&tok[..enc_seq]);
            t.dec_tokens.extend_from_slice(&tok[enc_seq..]);
            t.labels.extend(lab[enc_seq..].iter().map(|&l| l.max(0)));
            t.loss_mask.extend_from_slice(&mask[enc_seq..]);
            let enc_len = mask[..enc_seq].iter().take_while(|&&m| m > 0.0).count();
            if mask[enc_len..enc_seq].iter().any(|&m| m > 0.0) {
                bail!(
                    "t5 batch row {r}: the encoder padding mask is not a prefix of ones (padding must be on the right)"
                );
            }
            if enc_len == 0 {
                bail!("t5 batch row {r}: the encoder input is empty (encoder mask all zeros)");
            }
            t.enc_len.push(enc_len);
            t.dec_len.push(mask[enc_seq..].iter().rposition(|&m| m > 0.0).map_or(dec_seq, |p| p + 1));
        }
        Ok(t)
    }

    /// A batch without padding (generation, `Model::logits`): `tokens (B, S_enc + S_dec)`.
    pub fn unpadded(tokens: &[i32], mbs: usize, enc_seq: usize, dec_seq: usize) -> Result<T5Batch> {
        let s = enc_seq + dec_seq;
        let b = Batch {
            micro_batch_size: mbs,
            seq_length: s,
            tokens: tokens.to_vec(),
            labels: vec![0; mbs * s],
            loss_mask: vec![1.0; mbs * s],
            seed: 0,
        };
        T5Batch::unpack(&b, enc_seq, dec_seq)
    }
}
