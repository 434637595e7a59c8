//! Greedy encoder-decoder generation without caches: every step reruns the encoder and the
//! decoder over a decoder row padded to the model's `decoder_seq_length` (the causal mask makes
//! the padding invisible to the positions already generated) and takes the arg-max of the
//! logits at the newest position. O(steps · (S_enc + S_dec)) work: the reference that the
//! cached decoding of [`crate::decode`] (encoder once, KV caches) is checked against.

use crate::model::T5Model;
use anyhow::{bail, Result};
use megatron_core::Model;

/// Greedy continuation of `decoder_start` for the encoder input `enc` (exactly
/// `encoder_seq_length` tokens): up to `max_new` tokens, stopping after `eos`. Returns the
/// decoder row (start token included), as transformers' `generate` does. Needs tp = 1
/// (the arg-max reads the whole vocabulary).
pub fn greedy(
    model: &mut T5Model,
    enc: &[i32],
    decoder_start: i32,
    eos: Option<i32>,
    max_new: usize,
) -> Result<Vec<i32>> {
    let (se, sd) = (model.config().encoder_seq_length, model.config().decoder_seq_length);
    let vocab = model.config().vocab_size;
    if enc.len() != se {
        bail!("t5 greedy: the encoder input has {} tokens, the model's --encoder-seq-length is {se}", enc.len());
    }
    if max_new + 1 > sd {
        bail!("t5 greedy: {max_new} new tokens need --decoder-seq-length >= {}", max_new + 1);
    }
    let be = model.backend();
    let mut dec = vec![decoder_start];
    while dec.len() <= max_new {
        let mut tokens = enc.to_vec();
        tokens.extend(&dec);
        tokens.resize(se + sd, 0);
        let logits = be.to_host(&model.logits(&tokens, 1, se + sd)?)?.to_f32_vec();
        let width = logits.len() / sd;
        if width < vocab {
            bail!("t5 greedy needs the whole vocabulary on one rank (tensor parallel size 1)");
        }
        let row = &logits[(dec.len() - 1) * width..(dec.len() - 1) * width + vocab];
        // First maximum on ties, as torch.argmax.
        let next =
            row.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as i32;
        dec.push(next);
        if Some(next) == eos {
            break;
        }
    }
    Ok(dec)
}
