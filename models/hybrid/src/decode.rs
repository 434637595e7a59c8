//! Recurrent generation: one token per row per call, with every Mamba layer's conv state
//! `(B, K−1, Di + 2GN)` and SSM state `(B, H, N, P)` cached (constant memory per token) next
//! to the KV cache of the attention layers ([`LayerKvCache`]) in the same model.
//!
//! Per Mamba layer and token: `in_proj` → conv step (shift register) + SiLU → Δ, A →
//! `s = exp(ΔA) s + Δ B xᵀ`, `y = Cᵀ s + D x` → gated RMSNorm → `out_proj`, the same math as
//! the training forward (checked against it in `tests/decode.rs`).

use crate::config::LayerKind;
use crate::layers::{Branch, HybridLayer};
use crate::mixer::{cols, read, MambaMixer};
use crate::model::HybridModel;
use crate::ops::conv::conv_silu_step;
use crate::ops::dt::{a_from_log, softplus_dt_forward};
use crate::ops::gated_norm::gated_rmsnorm_forward;
use anyhow::{bail, Context, Result};
use megatron_core::{DType, DeviceTensor, HostBuffer};
use megatron_transformer::tp_mappings::reduce_from_tp_region_forward;
use megatron_transformer::{linear_forward, LayerKvCache, StepInfo};

/// The cached state of one layer.
pub enum LayerCache {
    Mamba { conv: Vec<f32>, ssm: Vec<f32> }, // (B, K−1, Ch), (B, H, N, P) fp32
    Attention(LayerKvCache),
    None,
}

/// Every layer's state for `batch` rows; `len` tokens consumed so far.
pub struct HybridCache {
    pub layers: Vec<LayerCache>,
    pub batch: usize,
    pub len: usize,
    /// Token capacity of the attention layers' KV caches (Mamba layers have no limit).
    pub capacity: usize,
}

impl MambaMixer {
    /// `out (B, C)` for one token `u (B, C)` per row, updating `conv` and `ssm`.
    fn forward_step(&self, u: &DeviceTensor, out: &mut DeviceTensor, conv: &mut [f32], ssm: &mut [f32]) -> Result<()> {
        let be = self.backend();
        let d = self.dims;
        let (batch, di, ch, h, gn) = (u.shape()[0], d.d_inner(), d.conv_channels(), d.heads, d.groups * d.state);
        let (p, n, width) = (d.head_dim, d.state, d.in_proj_width());
        let mut zx = be.zeros(&[batch, width], DType::F32)?;
        linear_forward(be, u, &self.in_proj.value, None, &mut zx)?;
        let zx = read(be, &zx)?; // (B, width)
        let w = read(be, &self.conv_weight.value)?;
        let xbc = conv_silu_step(ch, d.conv, conv, &cols(&zx, width, di, ch), &w, &read(be, &self.conv_bias.value)?);
        let delta = softplus_dt_forward(&cols(&zx, width, di + ch, h), &read(be, &self.dt_bias.value)?); // (B, H)
        let a = a_from_log(&read(be, &self.a_log.value)?);
        let dv = read(be, &self.d.value)?;
        let mut y = vec![0.0f32; batch * di];
        for b in 0..batch {
            let row = &xbc[b * ch..(b + 1) * ch];
            for hh in 0..h {
                let g = hh / (h / d.groups);
                let (x, bm, cm) = (
                    &row[hh * p..(hh + 1) * p],
                    &row[di + g * n..di + (g + 1) * n],
                    &row[di + gn + g * n..di + gn + (g + 1) * n],
                );
                let dt = delta[b * h + hh];
                let alpha = (dt * a[hh]).exp();
                let s = &mut ssm[(b * h + hh) * n * p..(b * h + hh + 1) * n * p];
                let yh = &mut y[b * di + hh * p..b * di + (hh + 1) * p];
                for (k, xv) in x.iter().enumerate() {
                    yh[k] = dv[hh] * xv;
                }
                for ni in 0..n {
                    for k in 0..p {
                        let sv = &mut s[ni * p + k];
                        *sv = alpha * *sv + dt * bm[ni] * x[k];
                        yh[k] += cm[ni] * *sv;
                    }
                }
            }
        }
        let (yn, _) =
            gated_rmsnorm_forward(&y, &cols(&zx, width, 0, di), &read(be, &self.norm.value)?, d.groups, self.eps())?;
        let yn = be.from_host(HostBuffer::F32(yn), &[batch, di])?;
        linear_forward(be, &yn, &self.out_proj.value, None, out)?;
        reduce_from_tp_region_forward(self.ctx(), out)
    }
}

impl HybridLayer {
    fn forward_step(
        &mut self,
        x: &DeviceTensor,
        y: &mut DeviceTensor,
        cache: &mut LayerCache,
        offset: usize,
    ) -> Result<()> {
        let be = self.backend.clone();
        let be = be.as_ref();
        let mut normed = be.zeros(x.shape(), DType::F32)?;
        self.norm.forward(x, &mut normed)?;
        let step = StepInfo { batch: x.shape()[0], seq: 1, train: false, seed: 0 };
        match (&mut self.branch, cache) {
            (Branch::Mamba(m), LayerCache::Mamba { conv, ssm }) => m.forward_step(&normed, y, conv, ssm)?,
            (Branch::Attention(a), LayerCache::Attention(kv)) => {
                a.forward_cached(&normed, y, kv, offset, None, &step)?
            }
            (Branch::Mlp(m), LayerCache::None) => m.forward(&normed, y, &step)?,
            (Branch::Moe(m), LayerCache::None) => m.forward(&normed, y, &step)?,
            _ => bail!("layer {}: cache of the wrong kind", self.layer_number),
        }
        be.axpy(y, 1.0, x)
    }
}

impl HybridModel {
    /// Empty states for `batch` rows; attention layers hold up to `capacity` tokens.
    pub fn new_cache(&self, batch: usize, capacity: usize) -> Result<HybridCache> {
        self.ensure_whole("recurrent decoding")?;
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(match &l.branch {
                    Branch::Mamba(m) => {
                        let d = m.dims;
                        LayerCache::Mamba {
                            conv: vec![0.0; batch * (d.conv - 1) * d.conv_channels()],
                            ssm: vec![0.0; batch * d.heads * d.state * d.head_dim],
                        }
                    }
                    Branch::Attention(a) => LayerCache::Attention(a.new_kv_cache(batch, capacity)?),
                    Branch::Mlp(_) | Branch::Moe(_) => LayerCache::None,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(HybridCache { layers, batch, len: 0, capacity })
    }

    /// Logits `(B, V_padded)` of the next token after feeding `tokens` (one per row).
    pub fn decode_step(&mut self, tokens: &[i32], cache: &mut HybridCache) -> Result<Vec<f32>> {
        if tokens.len() != cache.batch {
            bail!("decode step: {} tokens for a cache of {} rows", tokens.len(), cache.batch);
        }
        let has_attention = self.layers.iter().any(|l| l.kind == LayerKind::Attention);
        if has_attention && cache.len >= cache.capacity {
            bail!("decode step: the attention KV cache is full ({} tokens); allocate a larger one", cache.capacity);
        }
        let be = self.backend();
        let be = be.as_ref();
        let step = StepInfo { batch: cache.batch, seq: 1, train: false, seed: 0 };
        let h = self.config().hidden_size;
        let ids = be.from_host(HostBuffer::I32(tokens.to_vec()), &[tokens.len()])?;
        let mut x = be.zeros(&[cache.batch, h], DType::F32)?;
        self.ensure_whole("recurrent decoding")?;
        self.embedding.as_mut().context("decoding needs the embedding (first stage)")?.forward(&ids, &mut x, &step)?;
        for (layer, c) in self.layers.iter_mut().zip(&mut cache.layers) {
            let mut y = be.zeros(&[cache.batch, h], DType::F32)?;
            layer.forward_step(&x, &mut y, c, cache.len)?;
            x = y;
        }
        cache.len += 1;
        let mut head_in = be.zeros(&[cache.batch, h], DType::F32)?;
        self.final_norm.as_mut().context("decoding needs the final norm (last stage)")?.forward(&x, &mut head_in)?;
        let logits = self.head_logits(&head_in, cache.batch)?;
        read(be, &logits)
    }
}
