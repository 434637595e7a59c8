//! Incremental encoder-decoder decoding for [`T5Model`] (inference, batch 1, tp = 1): the
//! encoder runs once ([`T5Model::encode`]), every decoder layer's cross-attention keys/values
//! are computed once from its output, and each new decoder position runs alone through the
//! decoder with a key/value cache of the earlier positions' self-attention. Each step costs
//! one position's work instead of [`crate::generate::greedy`]'s rerun of both stacks.
//!
//! The self-attention cache lives on the host (`(t, heads, 2, hd)` per layer, uploaded for the
//! attention op each step): the backend has no op to append a row to a device tensor, and the
//! T5 layers already go through the host for their q/kv split. The sums are the ones of the
//! full forward (same ops, same order), so the logits equal the uncached ones up to the
//! matmul kernels' row-count-dependent blocking (checked by `tests/decode_cache.rs`).

use crate::host::lengths;
use crate::model::T5Model;
use anyhow::{bail, Result};
use megatron_core::{DType, DeviceTensor, HostBuffer};
use megatron_transformer::linear_forward;

/// What decoding one input keeps between steps.
pub struct T5DecodeState {
    /// Encoder input length.
    pub enc_len: usize,
    enc_valid: DeviceTensor,     // int32 [1]
    cross_kv: Vec<DeviceTensor>, // per decoder layer (S_enc, heads, 2, hd)
    self_kv: Vec<Vec<f32>>,      // per decoder layer, host (t, heads, 2, hd)
    /// Decoder positions consumed so far.
    pub pos: usize,
}

impl T5Model {
    /// Encodes `enc` once and computes every decoder layer's cross-attention keys/values.
    pub fn start_decode(&mut self, enc: &[i32]) -> Result<T5DecodeState> {
        if self.tp_size() != 1 {
            bail!("t5 incremental decoding needs tensor parallel size 1 (the arg-max reads the whole vocabulary)");
        }
        let enc_out = self.encode(enc)?;
        let cross_kv = self
            .decoder
            .iter_mut()
            .map(|l| match &mut l.cross {
                Some((_, c)) => c.cross_kv(&enc_out),
                None => bail!("t5 decoder layer without cross-attention"),
            })
            .collect::<Result<Vec<_>>>()?;
        let be = self.backend();
        Ok(T5DecodeState {
            enc_len: enc.len(),
            enc_valid: lengths(be.as_ref(), &[enc.len()])?,
            self_kv: vec![Vec::new(); cross_kv.len()],
            cross_kv,
            pos: 0,
        })
    }

    /// Feeds the decoder token at position `state.pos`; returns its logits over the padded
    /// vocabulary (`[V_padded]`, the next-token distribution).
    pub fn decode_step(&mut self, state: &mut T5DecodeState, token: i32) -> Result<Vec<f32>> {
        let be = self.backend();
        let be = be.as_ref();
        let t = state.pos;
        let h = self.config().hidden_size;
        // Embedding of one token at position t: word row + position row, as the full forward.
        let ids = be.from_host(HostBuffer::I32(vec![token]), &[1])?;
        let mut x = be.zeros(&[1, h], DType::F32)?;
        self.embedding.word_embeddings.forward(&ids, &mut x)?;
        if let Some(p) = &self.embedding.position_embeddings {
            let max = p.value.shape()[0];
            if t >= max {
                bail!("t5 decoding: position {t} is past max_position_embeddings {max}; generate fewer tokens");
            }
            let pos = be.from_host(HostBuffer::I32(vec![t as i32]), &[1])?;
            be.embedding_forward(&pos, &p.value, 0, &mut x, true)?;
        }
        let bias = self.decoder_relative.as_ref().map(|r| r.forward_rows(t, 1, t + 1)).transpose()?; // (heads, 1, t+1)
        for (i, layer) in self.decoder.iter_mut().enumerate() {
            x = layer.decode_step(&x, &mut state.self_kv[i], bias.as_ref(), &state.cross_kv[i], &state.enc_valid)?;
        }
        let mut head_in = be.zeros(&[1, h], DType::F32)?;
        self.decoder_final_layernorm.forward(&x, &mut head_in)?;
        if let Some(s) = self.config().output_scale {
            be.scale(&mut head_in, s)?;
        }
        let w = self.head_weight();
        let mut logits = be.zeros(&[1, w.shape()[0]], DType::F32)?;
        linear_forward(be, &head_in, w, self.lm_head_bias.as_ref().map(|p| &p.value), &mut logits)?;
        state.pos += 1;
        Ok(be.to_host(&logits)?.to_f32_vec())
    }
}

/// Decodes up to `max_new` tokens after `decoder_start` for the encoder input `enc`, choosing
/// each next token with `pick` from the logits over the unpadded vocabulary (`[vocab]`) and
/// stopping after any token of `stop`. `on_token` sees every new token (streaming). Returns the decoder row
/// (start token included), as transformers' `generate` does.
pub fn decode_with(
    model: &mut T5Model,
    enc: &[i32],
    decoder_start: i32,
    stop: &[i32],
    max_new: usize,
    pick: &mut dyn FnMut(&[f32]) -> Result<i32>,
    on_token: &mut dyn FnMut(i32),
) -> Result<Vec<i32>> {
    let vocab = model.config().vocab_size;
    let mut state = model.start_decode(enc)?;
    let mut dec = vec![decoder_start];
    while dec.len() <= max_new {
        let logits = model.decode_step(&mut state, *dec.last().unwrap_or(&decoder_start))?;
        let next = pick(&logits[..vocab])?;
        dec.push(next);
        on_token(next);
        if stop.contains(&next) {
            break;
        }
    }
    Ok(dec)
}

/// First maximum on ties, as `torch.argmax`.
pub fn argmax(row: &[f32]) -> i32 {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as i32
}

/// Greedy [`decode_with`].
pub fn greedy_cached(
    model: &mut T5Model,
    enc: &[i32],
    decoder_start: i32,
    eos: Option<i32>,
    max_new: usize,
) -> Result<Vec<i32>> {
    let stop: Vec<i32> = eos.into_iter().collect();
    decode_with(model, enc, decoder_start, &stop, max_new, &mut |r| Ok(argmax(r)), &mut |_| {})
}
