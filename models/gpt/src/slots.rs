//! Continuous batching for [`GptModel`]: a *slotted* key/value cache ([`SlotKvCache`]) with one
//! fixed-capacity slot per in-flight request, and [`GptModel::forward_slots`], which runs new
//! tokens of any subset of slots, each at its own position.
//!
//! Unlike [`crate::KvCache`] (one shared offset: Megatron's static batching), a slot is filled
//! and freed independently: a request is prefilled into a free slot while others decode, and
//! its slot is reused as soon as it finishes. Positions are absolute per slot (`len + t`), so a
//! request's logits do not depend on which other requests share the step. Rotary models need
//! one offset per call (the caller groups rows by length). Needs tp = pp = 1, like `KvCache`.

use crate::model::GptModel;
use anyhow::{bail, Result};
use megatron_core::{DType, DeviceTensor, HostBuffer};
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

    /// Runs `tokens (B, Tq)`: row `r` continues slot `slots[r]` at position `cache.len(slot)`.
    /// Appends their keys/values and returns the logits `(B, Tq, V_padded)` on the host.
    pub fn forward_slots(&mut self, tokens: &[i32], slots: &[usize], cache: &mut SlotKvCache) -> Result<Vec<f32>> {
        let Some(embedding) = self.embedding.as_mut() else {
            bail!("kv-cache decoding runs the whole model; this is a later pipeline stage (use pp = 1)");
        };
        if self.output_layer.is_none() && self.shared_embedding.is_some() {
            bail!("kv-cache decoding runs the whole model; this is one pipeline stage of several (use pp = 1)");
        }
        let tp = embedding.word_embeddings.weight.layout.tp_size;
        if tp != 1 {
            bail!("kv-cache decoding needs --tensor-model-parallel-size 1 (the model has tp = {tp})");
        }
        let b = slots.len();
        if b == 0 || tokens.is_empty() || !tokens.len().is_multiple_of(b) {
            bail!("{} new tokens do not split into {b} slots", tokens.len());
        }
        let tq = tokens.len() / b;
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
        let bk = self.backend.as_ref();
        let ids = bk.from_host(HostBuffer::I32(tokens.to_vec()), &[tokens.len()])?;
        let positions: Vec<i32> = offsets.iter().flat_map(|&o| (o..o + tq).map(|p| p as i32)).collect();
        let positions = bk.from_host(HostBuffer::I32(positions), &[tokens.len()])?;
        let step = StepInfo { batch: b, seq: tq, train: false, seed: 0 };
        self.stash.clear();
        self.live = None;

        let input = self.decoder.input_mut(&step)?;
        embedding.word_embeddings.forward(&ids, input)?;
        if let Some(pos) = &embedding.position_embeddings {
            bk.embedding_forward(&positions, &pos.value, 0, input, true)?;
        }
        self.decoder.forward_slots(&step, &mut cache.layers, slots, &offsets)?;

        ensure_shape(bk, &mut cache.logits, &[b, tq, vocab])?;
        let w = match &self.output_layer {
            Some(p) => &p.value,
            None => &embedding.word_embeddings.weight.value,
        };
        linear_forward(bk, self.decoder.output(), w, None, &mut cache.logits)?;
        for &s in slots {
            cache.lens[s] += tq;
        }
        Ok(bk.to_host(&cache.logits)?.to_f32_vec())
    }
}
