//! Continuous batching for [`GptModel`]: a *slotted* key/value cache ([`SlotKvCache`]) with one
//! fixed-capacity slot per in-flight request, and [`GptModel::forward_slots`], which runs new
//! tokens of any subset of slots, each at its own position.
//!
//! Unlike [`crate::KvCache`] (one shared offset: Megatron's static batching), a slot is filled
//! and freed independently: a request is prefilled into a free slot while others decode, and
//! its slot is reused as soon as it finishes. Positions are absolute per slot (`len + t`), so a
//! request's logits do not depend on which other requests share the step. Rotary models need
//! one offset per call (the caller groups rows by length). Tensor and pipeline parallel models
//! run it on every rank in step (see [`GptModel::forward_slots`]); sequence parallelism is refused.

use crate::model::GptModel;
use anyhow::{bail, Context, Result};
use megatron_core::{Backend, DType, DeviceTensor, HostBuffer, ParallelContext};
use megatron_transformer::step::ensure_shape;
use megatron_transformer::{linear_forward, LayerKvCache, StepInfo};

/// Per-layer caches of `slots` rows of `capacity` tokens and the length of every slot.
pub struct SlotKvCache {
    layers: Vec<LayerKvCache>,
    lens: Vec<usize>,
    capacity: usize,
    logits: DeviceTensor, // (B, Tq, V_padded) of the last call
}

impl SlotKvCache {
    pub fn slots(&self) -> usize {
        self.lens.len()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Tokens cached in `slot`.
    pub fn len(&self, slot: usize) -> usize {
        self.lens[slot]
    }

    /// Forgets `slot`'s tokens (a finished or cancelled request); the memory is reused.
    pub fn free(&mut self, slot: usize) {
        self.lens[slot] = 0;
    }

    /// Bytes of k/v one slot holds (for a memory budget): layers × 2 × capacity × heads × dim × 4.
    pub fn bytes_per_slot(model: &GptModel, capacity: usize) -> usize {
        let c = model.config();
        let kv_heads = c.num_attention_heads; // the cache keeps every head's k/v (GQA expanded)
        let head_dim = c.kv_channels.unwrap_or(c.hidden_size / c.num_attention_heads.max(1));
        c.num_layers * 2 * capacity * kv_heads * head_dim * 4
    }
}

/// One [`GptModel::forward_slots_with`] call.
#[derive(Clone, Copy, Debug)]
pub struct SlotCall<'a> {
    /// `(B, Tq)`: row `r` continues slot `slots[r]` at position `cache.len(slots[r])`.
    pub tokens: &'a [i32],
    pub slots: &'a [usize],
    /// Real tokens of each row (`≤ Tq`); the rest of the row is padding.
    pub valid: &'a [usize],
    /// Flat positions `r * Tq + t` (each `t < valid[r]`) whose logits are returned, in order.
    pub pick: &'a [usize],
}

/// The rows `pick` of `hidden (B, Tq, C)` as a `(pick, C)` tensor of the same dtype.
fn pick_rows(bk: &dyn Backend, hidden: &DeviceTensor, pick: &[usize]) -> Result<DeviceTensor> {
    let c = hidden.shape().last().copied().unwrap_or(0);
    let all = bk.to_host(hidden)?.to_f32_vec();
    let rows: Vec<f32> = pick.iter().flat_map(|&p| all[p * c..(p + 1) * c].iter().copied()).collect();
    let picked = bk.from_host(HostBuffer::F32(rows), &[pick.len(), c])?;
    if hidden.dtype() == DType::F32 {
        return Ok(picked);
    }
    // Half-precision activations: the round trip through f32 is exact.
    let mut out = bk.zeros(&[pick.len(), c], hidden.dtype())?;
    bk.cast(&picked, &mut out)?;
    Ok(out)
}

impl GptModel {
    /// An empty slotted cache of `slots` requests of up to `capacity` tokens each.
    pub fn new_slot_kv_cache(&self, slots: usize, capacity: usize) -> Result<SlotKvCache> {
        let max = self.config().max_position_embeddings;
        if capacity > max && !self.config().uses_rope() {
            bail!("a kv cache slot of {capacity} tokens exceeds max_position_embeddings {max}");
        }
        if slots == 0 || capacity == 0 {
            bail!("a slotted kv cache needs at least one slot of at least one token");
        }
        Ok(SlotKvCache {
            layers: self.decoder.new_kv_caches(slots, capacity)?,
            lens: vec![0; slots],
            capacity,
            logits: self.backend.zeros(&[0], DType::F32)?,
        })
    }

    /// The ranks this model is one shard of (tensor and pipeline parallel layout).
    pub fn parallel_context(&self) -> &ParallelContext {
        &self.ctx
    }

    /// Runs `tokens (B, Tq)`: row `r` continues slot `slots[r]` at position `cache.len(slot)`.
    /// Appends their keys/values and returns the logits `(B, Tq, V_padded)` on the host.
    ///
    /// With tensor and pipeline parallelism every rank of the model calls this with the same
    /// arguments (a collective): the first stage embeds the tokens, each stage sends its hidden
    /// states `(B, Tq, C)` to the next, the last stage all-gathers its vocab-parallel logits
    /// over the TP group and sends the full logits back to the first stage. The logits are
    /// returned on the first and the last stage; the stages in between return an empty vector.
    pub fn forward_slots(&mut self, tokens: &[i32], slots: &[usize], cache: &mut SlotKvCache) -> Result<Vec<f32>> {
        let tq = if slots.is_empty() { 0 } else { tokens.len() / slots.len() };
        let valid = vec![tq; slots.len()];
        let pick: Vec<usize> = (0..tokens.len()).collect();
        self.forward_slots_with(&SlotCall { tokens, slots, valid: &valid, pick: &pick }, cache)
    }

    /// [`Self::forward_slots`] for batched and chunked prefill: rows padded at the end (only
    /// `call.valid[r]` tokens of row `r` enter its slot) and logits `(pick, V_padded)` only for
    /// the positions in `call.pick` (none: the output layer is skipped, e.g. a prompt chunk
    /// that is not the last one). Padding never changes a real token's result: a token attends
    /// only to the positions before it, and the padded keys/values past `valid` are overwritten
    /// by the slot's next tokens before anything attends to them.
    pub fn forward_slots_with(&mut self, call: &SlotCall, cache: &mut SlotKvCache) -> Result<Vec<f32>> {
        let SlotCall { tokens, slots, valid, pick } = *call;
        if self.sequence_parallel() {
            bail!("kv-cache decoding does not run with --sequence-parallel; load the model without it");
        }
        let b = slots.len();
        if b == 0 || tokens.is_empty() || !tokens.len().is_multiple_of(b) {
            bail!("{} new tokens do not split into {b} slots", tokens.len());
        }
        let tq = tokens.len() / b;
        if valid.len() != b || valid.iter().any(|&v| v > tq) {
            bail!("{} valid lengths for {b} rows of {tq} tokens: each row needs one, at most {tq}", valid.len());
        }
        if let Some(&p) = pick.iter().find(|&&p| p >= b * tq || p % tq >= valid[p / tq]) {
            bail!("logits asked for position {p}, which is padding or outside the {b} x {tq} tokens");
        }
        let offsets: Vec<usize> = slots
            .iter()
            .map(|&s| cache.lens.get(s).copied().ok_or_else(|| anyhow::anyhow!("slot {s} out of range")))
            .collect::<Result<_>>()?;
        if let Some((&s, &o)) = slots.iter().zip(&offsets).find(|(_, &o)| o + tq > cache.capacity) {
            bail!("slot {s}: {o} cached + {tq} new tokens exceed the slot capacity {}", cache.capacity);
        }
        let vocab = self.vocab_padded;
        if let Some(&bad) = tokens.iter().find(|&&t| t < 0 || t as usize >= vocab) {
            bail!("token id {bad} is outside the vocabulary [0, {vocab}); check the tokenizer");
        }
        let bk = self.backend.clone();
        let bk = bk.as_ref();
        let step = StepInfo { batch: b, seq: tq, train: false, seed: 0 };
        self.stash.clear();
        self.live = None;
        let (first, last) = (self.ctx.is_first_stage(), self.ctx.is_last_stage());
        let pp = &self.ctx.pp_group;
        let stage = self.ctx.pp_rank;

        let input = self.decoder.input_mut(&step)?;
        match self.embedding.as_mut() {
            Some(embedding) => {
                // Vocab-parallel lookup (all-reduced over TP) at absolute positions.
                let ids = bk.from_host(HostBuffer::I32(tokens.to_vec()), &[tokens.len()])?;
                embedding.word_embeddings.forward(&ids, input)?;
                if let Some(pos) = &embedding.position_embeddings {
                    let positions: Vec<i32> = offsets.iter().flat_map(|&o| (o..o + tq).map(|p| p as i32)).collect();
                    let positions = bk.from_host(HostBuffer::I32(positions), &[tokens.len()])?;
                    bk.embedding_forward(&positions, &pos.value, 0, input, true)?;
                }
            }
            None => self
                .ctx
                .comm
                .recv(pp, input, pp.ranks[stage - 1])
                .with_context(|| format!("stage {stage}: receiving the hidden states of the previous stage"))?,
        }
        self.decoder.forward_slots(&step, &mut cache.layers, slots, &offsets)?;
        for (&s, &v) in slots.iter().zip(valid) {
            cache.lens[s] += v;
        }
        let rows = pick.len();
        if rows == 0 {
            // No logits wanted: every stage skips its output layer and the logit transfers.
            if !last {
                self.ctx
                    .comm
                    .send(pp, self.decoder.output(), pp.ranks[stage + 1])
                    .with_context(|| format!("stage {stage}: sending the hidden states to the next stage"))?;
            }
            return Ok(Vec::new());
        }
        if !last {
            self.ctx
                .comm
                .send(pp, self.decoder.output(), pp.ranks[stage + 1])
                .with_context(|| format!("stage {stage}: sending the hidden states to the next stage"))?;
            if !first {
                return Ok(Vec::new());
            }
            // The first stage gets the full logits back from the last one.
            let mut logits = bk.zeros(&[rows, vocab], DType::F32)?;
            let src = *pp.ranks.last().unwrap_or(&pp.ranks[0]);
            self.ctx.comm.recv(pp, &mut logits, src).context("receiving the logits of the last stage")?;
            return Ok(bk.to_host(&logits)?.to_f32_vec());
        }
        let tp = self.ctx.tp_size();
        ensure_shape(bk, &mut cache.logits, &[rows, vocab / tp])?;
        let w = match (&self.output_layer, &self.shared_embedding, &self.embedding) {
            (Some(p), _, _) | (None, Some(p), _) => &p.value,
            (None, None, Some(e)) => &e.word_embeddings.weight.value,
            (None, None, None) => bail!("pipeline stage {stage} has no output layer"),
        };
        let hidden = self.decoder.output();
        if pick.iter().copied().eq(0..b * tq) {
            linear_forward(bk, hidden, w, None, &mut cache.logits)?;
        } else {
            let picked = pick_rows(bk, hidden, pick)?;
            linear_forward(bk, &picked, w, None, &mut cache.logits)?;
        }
        let local = bk.to_host(&cache.logits)?.to_f32_vec();
        let full = if tp == 1 { local } else { self.gather_vocab(&cache.logits, rows)? };
        if !first {
            let t = bk.from_host(HostBuffer::F32(full.clone()), &[rows, vocab])?;
            self.ctx.comm.send(pp, &t, pp.ranks[0]).context("sending the logits to the first stage")?;
        }
        Ok(full)
    }

    /// The full `(rows, V_padded)` logits from this rank's vocab-parallel `(rows, V/tp)` slice:
    /// all-gathered over TP (group order = vocab order), then the slices put side by side.
    fn gather_vocab(&self, local: &DeviceTensor, rows: usize) -> Result<Vec<f32>> {
        let (tp, bk) = (self.ctx.tp_size(), self.backend.as_ref());
        let mut gathered = bk.zeros(&[tp * local.numel()], DType::F32)?;
        self.ctx.comm.all_gather(&self.ctx.tp_group, local, &mut gathered).context("gathering the logits over TP")?;
        let g = bk.to_host(&gathered)?.to_f32_vec();
        let vl = local.numel() / rows.max(1);
        let mut full = vec![0f32; g.len()];
        for (r, part) in g.chunks(rows * vl).enumerate() {
            for (row, src) in part.chunks(vl).enumerate() {
                full[row * vl * tp + r * vl..][..vl].copy_from_slice(src);
            }
        }
        Ok(full)
    }
}
