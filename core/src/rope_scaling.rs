//! Rotary frequency scaling (context extension): the per-channel inverse frequencies
//! `inv_freq_i` of a rotary embedding, plain or rescaled.
//!
//! - [`RopeScaling::Linear`] (position interpolation; Megatron's
//!   `--rotary-seq-len-interpolation-factor`, Hugging Face's `rope_scaling.type = "linear"`):
//!   every frequency divided by `factor`, i.e. positions divided by `factor`.
//! - [`RopeScaling::Llama3`] (Llama-3.1/3.2; Megatron's `--use-rope-scaling
//!   --rope-scaling-factor`, Hugging Face's `rope_type = "llama3"`): long wavelengths
//!   (`> original_max_position_embeddings / low_freq_factor`) divided by `factor`, short ones
//!   (`< original / high_freq_factor`) kept, the band between interpolated smoothly.
//!
//! Everything is computed in f32 in the order transformers' `_compute_llama3_parameters` uses
//! (the reference; `scripts/rope_scaling_fixture.py` writes its values for the parity test).
//! [`rotary_host`] is the host rotation with given frequencies: the default of
//! [`crate::RotaryOps::rotary_scaled`] and the reference of backends' kernels.

use crate::backend::RotarySpec;
use crate::Result;
use anyhow::bail;
use serde::{Deserialize, Serialize};

/// How the rotary frequencies are rescaled; `None` is the plain `base^(-2i/d)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum RopeScaling {
    #[default]
    None,
    Linear {
        factor: f32,
    },
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
}

impl RopeScaling {
    /// Megatron's `--use-rope-scaling --rope-scaling-factor F`: Llama-3.1's constants
    /// (low 1, high 4, original context 8192) with factor `F` (Megatron's default 8).
    pub fn megatron_llama3(factor: f32) -> RopeScaling {
        RopeScaling::Llama3 {
            factor,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }
    }

    pub fn is_none(&self) -> bool {
        *self == RopeScaling::None
    }

    /// Checks the parameters (factors > 0 and finite, `high_freq_factor > low_freq_factor`).
    pub fn validate(&self) -> Result<()> {
        let ok = |x: f32| x > 0.0 && x.is_finite();
        match *self {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => {
                if !ok(factor) {
                    bail!(
                        "linear rope scaling needs a factor > 0 (--rotary-seq-len-interpolation-factor), got {factor}"
                    );
                }
            }
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                if !ok(factor) || !ok(low_freq_factor) || !ok(high_freq_factor) {
                    bail!(
                        "llama3 rope scaling needs factor, low_freq_factor and high_freq_factor > 0 \
                         (--rope-scaling-factor), got {factor}, {low_freq_factor}, {high_freq_factor}"
                    );
                }
                if high_freq_factor <= low_freq_factor {
                    bail!("llama3 rope scaling needs high_freq_factor {high_freq_factor} > low_freq_factor {low_freq_factor}");
                }
                if original_max_position_embeddings == 0 {
                    bail!("llama3 rope scaling needs original_max_position_embeddings >= 1");
                }
            }
        }
        Ok(())
    }

    /// `inv_freq_i` for `i < rotary_dim / 2`: the plain `1 / base^(2i/rotary_dim)` (bit for bit
    /// what the unscaled kernels compute), then this scaling.
    pub fn inv_freq(&self, base: f32, rotary_dim: usize) -> Vec<f32> {
        let plain = (0..rotary_dim / 2).map(|i| 1.0 / base.powf((2 * i) as f32 / rotary_dim as f32));
        match *self {
            RopeScaling::None => plain.collect(),
            RopeScaling::Linear { factor } => plain.map(|f| f / factor).collect(),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                let old = original_max_position_embeddings as f32;
                let (low_wavelen, high_wavelen) = (old / low_freq_factor, old / high_freq_factor);
                plain
                    .map(|f| {
                        let wavelen = (2.0 * std::f32::consts::PI) / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
        }
    }
}

/// Rotates q and k (slots 0 and 1 of the fused `(B, T, heads, 3, head_dim)`) of every token by
/// `θ_i = pos · inv_freq[i]` (`-θ` when `inverse`), `pos = position_offset + t`. Pairs are the
/// two halves of the first `2·inv_freq.len()` channels, or adjacent channels when interleaved.
pub fn rotary_host(x: &mut [f32], spec: &RotarySpec, inv_freq: &[f32], inverse: bool) -> Result<()> {
    let RotarySpec { batch, seq, heads, head_dim, rotary_dim, interleaved, position_offset, .. } = *spec;
    if x.len() != batch * seq * heads * 3 * head_dim || inv_freq.len() * 2 != rotary_dim || rotary_dim > head_dim {
        bail!(
            "rotary_host: {spec:?} needs {} elements and {} frequencies, got {} and {}",
            batch * seq * heads * 3 * head_dim,
            rotary_dim / 2,
            x.len(),
            inv_freq.len()
        );
    }
    let half = inv_freq.len();
    let token = heads * 3 * head_dim;
    if token == 0 || seq == 0 {
        return Ok(());
    }
    for (row, tok) in x.chunks_exact_mut(token).enumerate() {
        let pos = (position_offset + row % seq) as f32;
        for head in tok.chunks_exact_mut(3 * head_dim) {
            for part in head[..2 * head_dim].chunks_exact_mut(head_dim) {
                for (i, &f) in inv_freq.iter().enumerate() {
                    let theta = pos * f;
                    let (cos, sin) = (theta.cos(), if inverse { -theta.sin() } else { theta.sin() });
                    let (a, b) = if interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
                    let (x1, x2) = (part[a], part[b]);
                    part[a] = x1 * cos - x2 * sin;
                    part[b] = x2 * cos + x1 * sin;
                }
            }
        }
    }
    Ok(())
}
