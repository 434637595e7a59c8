//! Incremental decoding for [`GptModel`]: a per-layer key/value cache ([`KvCache`]) and a
//! forward that runs only the new tokens of every row against it.
//!
//! Padding scheme (Megatron's static batching, SPEC §8.2): rows are right-padded; every call
//! processes the same `Tq` new positions `[len, len + Tq)` of every row, so all rows share one
//! cache offset and positions are absolute. The generation engine keeps a row's prompt token
//! instead of the sample while the row is still inside its prompt. The backend op also takes
//! per-row first keys (left padding); this model does not need them.
//!
//! Tensor parallelism: the logits stay vocab-parallel, so decoding needs tp = 1 (checked).

use crate::model::GptModel;
use anyhow::{bail, Result};
use megatron_core::{DType, DeviceTensor, HostBuffer};
use megatron_transformer::step::ensure_shape;
use megatron_transformer::{linear_forward, LayerKvCache, StepInfo};

/// Cached keys/values of every layer for `batch` rows of up to `capacity` tokens, plus the
/// number of tokens already processed per row (the offset of the next call).
pub struct KvCache {
    layers: Vec<LayerKvCache>,
    batch: usize,
    capacity: usize,
    len: usize,
    logits: DeviceTensor, // (B, Tq, V_padded) of the last call
}

impl KvCache {
    pub fn batch(&self) -> usize {
        self.batch
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Tokens per row already in the cache.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets the cached tokens (the buffers are reused).
    pub fn reset(&mut self) {
        self.len = 0;
    }
}

impl GptModel {
    /// An empty cache for `batch` rows of up to `capacity` tokens (≤ max_position_embeddings).
    pub fn new_kv_cache(&self, batch: usize, capacity: usize) -> Result<KvCache> {
        let max = self.config().max_position_embeddings;
        if capacity > max && !self.config().uses_rope() {
            bail!("a kv cache of {capacity} tokens exceeds max_position_embeddings {max}; generate fewer tokens");
        }
        Ok(KvCache {
            layers: self.decoder.new_kv_caches(batch, capacity)?,
            batch,
            capacity,
            len: 0,
            logits: self.backend.zeros(&[0], DType::F32)?,
        })
    }

    /// Runs the `tokens (B, Tq)` that follow the cached ones (positions `[len, len + Tq)` of
    /// every row), appends their keys/values and returns their logits `(B, Tq, V_padded)` on
    /// the host. Dropout is off.
    pub fn forward_cached(&mut self, tokens: &[i32], cache: &mut KvCache) -> Result<Vec<f32>> {
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
        let b = cache.batch;
        if b == 0 || tokens.is_empty() || !tokens.len().is_multiple_of(b) {
            bail!("{} new tokens do not split into the cache's {b} rows", tokens.len());
        }
        let tq = tokens.len() / b;
        let offset = cache.len;
        if offset + tq > cache.capacity {
            bail!("{offset} cached + {tq} new tokens exceed the kv cache capacity {}", cache.capacity);
        }
        let vocab = self.vocab_padded;
        if let Some(&bad) = tokens.iter().find(|&&t| t < 0 || t as usize >= vocab) {
            bail!("token id {bad} is outside the vocabulary [0, {vocab}); check the tokenizer");
        }
        let bk = self.backend.as_ref();
        let ids = bk.from_host(HostBuffer::I32(tokens.to_vec()), &[tokens.len()])?;
        let positions: Vec<i32> = (0..b).flat_map(|_| (offset..offset + tq).map(|p| p as i32)).collect();
        let positions = bk.from_host(HostBuffer::I32(positions), &[tokens.len()])?;
        let step = StepInfo { batch: b, seq: tq, train: false, seed: 0 };
        // The layer buffers are overwritten: no training microbatch can be backpropagated now.
        self.stash.clear();
        self.live = None;

        // Embedding at absolute positions (no dropout in inference).
        let input = self.decoder.input_mut(&step)?;
        embedding.word_embeddings.forward(&ids, input)?;
        if let Some(pos) = &embedding.position_embeddings {
            bk.embedding_forward(&positions, &pos.value, 0, input, true)?;
        }
        self.decoder.forward_cached(&step, &mut cache.layers, offset, None)?;

        ensure_shape(bk, &mut cache.logits, &[b, tq, vocab])?;
        let w = match &self.output_layer {
            Some(p) => &p.value,
            None => &embedding.word_embeddings.weight.value,
        };
        linear_forward(bk, self.decoder.output(), w, None, &mut cache.logits)?;
        cache.len += tq;
        Ok(bk.to_host(&cache.logits)?.to_f32_vec())
    }
}
