//! T5's relative position bias (SPEC §4.4): relative positions bucketed as Hugging Face's
//! `T5Attention._relative_position_bucket` does it (and Megatron-Core's
//! `RelativePositionEmbedding`, the same algorithm), a learned `[buckets, heads]` table per
//! stack, and the `(heads, Tq, Tk)` bias the attention op adds to its scores.
//!
//! The table is split over tensor parallelism along its heads (dim 1), like the attention
//! heads. The bias is gathered on the host (it is `heads·Tq·Tk` small lookups, once per stack
//! and microbatch; every layer of the stack shares it, as in T5).

use anyhow::Result;
use megatron_core::{Backend, DeviceTensor, HostBuffer, Param};
use megatron_transformer::{Init, ModuleBuilder, Split};
use std::sync::Arc;

/// Bucket of `relative = memory_position - query_position`. Bidirectional (encoder): half of
/// the buckets for keys after the query; unidirectional (decoder): keys after the query share
/// bucket 0. Within a half, distances below `num_buckets/4` (`max_exact`) have their own
/// bucket, larger ones are log-spaced up to `max_distance` (the last bucket beyond it). The
/// log is taken in f32 as the PyTorch reference does, so the buckets match it exactly.
pub fn relative_position_bucket(relative: i64, bidirectional: bool, num_buckets: usize, max_distance: usize) -> usize {
    let mut nb = num_buckets as i64;
    let mut bucket = 0i64;
    let n = if bidirectional {
        nb /= 2;
        if relative > 0 {
            bucket += nb;
        }
        relative.abs()
    } else {
        (-relative).max(0)
    };
    let max_exact = nb / 2;
    if n < max_exact {
        return (bucket + n) as usize;
    }
    let ratio = (n as f32 / max_exact as f32).ln() / ((max_distance as f64 / max_exact as f64).ln() as f32);
    let large = max_exact + (ratio * (nb - max_exact) as f32) as i64;
    (bucket + large.min(nb - 1)) as usize
}

/// A stack's learned bias table and its bucketing.
pub struct RelativeBias {
    backend: Arc<dyn Backend>,
    /// `[buckets, heads/tp]` (global `[buckets, heads]`, split on dim 1).
    pub weight: Param,
    bidirectional: bool,
    num_buckets: usize,
    max_distance: usize,
}

impl RelativeBias {
    /// Parameter `{prefix}.relative_attention_bias.weight` `[buckets, heads]`.
    pub fn new(
        b: &ModuleBuilder,
        prefix: &str,
        heads: usize,
        num_buckets: usize,
        max_distance: usize,
        bidirectional: bool,
        init_std: f32,
    ) -> Result<RelativeBias> {
        let weight = b.param(
            &format!("{prefix}.relative_attention_bias.weight"),
            &[num_buckets, heads],
            Split::Cols,
            Init::Normal(init_std),
        )?;
        Ok(RelativeBias { backend: b.backend.clone(), weight, bidirectional, num_buckets, max_distance })
    }

    /// Buckets of queries `q0..q0 + tq` against keys `0..tk`.
    fn buckets(&self, q0: usize, tq: usize, tk: usize) -> Vec<usize> {
        let mut v = Vec::with_capacity(tq * tk);
        for i in q0..q0 + tq {
            for j in 0..tk {
                v.push(relative_position_bucket(
                    j as i64 - i as i64,
                    self.bidirectional,
                    self.num_buckets,
                    self.max_distance,
                ));
            }
        }
        v
    }

    /// `bias (heads/tp, Tq, Tk)`: `bias[h, i, j] = table[bucket(j - i), h]`.
    pub fn forward(&self, tq: usize, tk: usize) -> Result<DeviceTensor> {
        self.forward_rows(0, tq, tk)
    }

    /// The rows `q0..q0 + tq` of [`Self::forward`]'s bias: `(heads/tp, tq, tk)` (incremental
    /// decoding asks for the newest query's row).
    pub fn forward_rows(&self, q0: usize, tq: usize, tk: usize) -> Result<DeviceTensor> {
        let table = self.backend.to_host(&self.weight.value)?.to_f32_vec();
        let heads = self.weight.value.shape()[1];
        let buckets = self.buckets(q0, tq, tk);
        let mut bias = vec![0.0f32; heads * tq * tk];
        for (h, plane) in bias.chunks_exact_mut(tq * tk).enumerate() {
            for (v, &bk) in plane.iter_mut().zip(&buckets) {
                *v = table[bk * heads + h];
            }
        }
        self.backend.from_host(HostBuffer::F32(bias), &[heads, tq, tk])
    }

    /// `d_table[bucket(j - i), h] += d_bias[h, i, j]` (fixed order: the result is deterministic).
    pub fn backward(&mut self, d_bias: &DeviceTensor, tq: usize, tk: usize) -> Result<()> {
        let d = self.backend.to_host(d_bias)?.to_f32_vec();
        let heads = self.weight.value.shape()[1];
        let buckets = self.buckets(0, tq, tk);
        let mut g = vec![0.0f32; self.num_buckets * heads];
        for (h, plane) in d.chunks_exact(tq * tk).enumerate() {
            for (&v, &bk) in plane.iter().zip(&buckets) {
                g[bk * heads + h] += v;
            }
        }
        let g = self.backend.from_host(HostBuffer::F32(g), &[self.num_buckets, heads])?;
        self.backend.axpy(&mut self.weight.grad, 1.0, &g)
    }
}
