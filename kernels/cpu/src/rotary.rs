//! Rotary position embedding on the q and k slots of a fused `(B, T, heads, 3, head_dim)` QKV,
//! in place. `inverse` rotates by `-θ` (the transpose), which is exactly the backward.
//! Angles follow Megatron: `inv_freq_i = base^(-2i/rotary_dim)` and `θ = pos · inv_freq_i`,
//! both in fp32. [`rotary_scaled`] takes the rescaled frequencies of a `RopeScaling` instead.

use crate::check::{f32s_mut, numel};
use megatron_core::anyhow::bail;
use megatron_core::{DeviceTensor, Result, RopeScaling, RotarySpec};
use rayon::prelude::*;

/// `cos θ` and `sin θ` (`[rotary_dim/2]` each) of one position.
pub(crate) fn angles(spec: &RotarySpec, pos: usize) -> (Vec<f32>, Vec<f32>) {
    let half = spec.rotary_dim / 2;
    (0..half)
        .map(|i| {
            let inv_freq = 1.0 / spec.base.powf((2 * i) as f32 / spec.rotary_dim as f32);
            let theta = pos as f32 * inv_freq;
            (theta.cos(), theta.sin())
        })
        .unzip()
}

/// `cos θ` and `sin θ` of one position from precomputed frequencies (rescaled rotary).
fn angles_from(inv_freq: &[f32], pos: usize) -> (Vec<f32>, Vec<f32>) {
    inv_freq
        .iter()
        .map(|&f| {
            let theta = pos as f32 * f;
            (theta.cos(), theta.sin())
        })
        .unzip()
}

pub(crate) fn validate(spec: &RotarySpec, qkv: &DeviceTensor) -> Result<()> {
    let RotarySpec { batch, seq, heads, head_dim, rotary_dim, base, .. } = *spec;
    if rotary_dim % 2 != 0 || rotary_dim == 0 || rotary_dim > head_dim {
        bail!("cpu backend: `rotary` needs an even rotary_dim in [2, head_dim={head_dim}], got {rotary_dim}");
    }
    if !(base > 0.0 && base.is_finite()) {
        bail!("cpu backend: `rotary` needs a positive base, got {base}");
    }
    numel(
        "rotary",
        "qkv",
        qkv,
        batch * seq * heads * 3 * head_dim,
        &format!("(B={batch}, T={seq}, heads={heads}, 3, head_dim={head_dim})"),
    )
}

/// Rotates one `head_dim` vector by `(cos, ±sin)`.
#[inline]
pub(crate) fn rotate(x: &mut [f32], cos: &[f32], sin: &[f32], interleaved: bool, inverse: bool) {
    let half = cos.len();
    let sgn = if inverse { -1.0 } else { 1.0 };
    for i in 0..half {
        let (a, b) = if interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
        let (x1, x2) = (x[a], x[b]);
        let s = sgn * sin[i];
        x[a] = x1 * cos[i] - x2 * s;
        x[b] = x2 * cos[i] + x1 * s;
    }
}

pub(crate) fn rotary(qkv: &mut DeviceTensor, spec: RotarySpec, inverse: bool) -> Result<()> {
    rotary_with(qkv, spec, None, inverse)
}

/// [`rotary`] with the frequencies of `scaling` (`RopeScaling::None` is [`rotary`] exactly).
pub(crate) fn rotary_scaled(
    qkv: &mut DeviceTensor,
    spec: RotarySpec,
    scaling: RopeScaling,
    inverse: bool,
) -> Result<()> {
    scaling.validate()?;
    let inv_freq = (!scaling.is_none()).then(|| scaling.inv_freq(spec.base, spec.rotary_dim));
    rotary_with(qkv, spec, inv_freq.as_deref(), inverse)
}

fn rotary_with(qkv: &mut DeviceTensor, spec: RotarySpec, inv_freq: Option<&[f32]>, inverse: bool) -> Result<()> {
    validate(&spec, qkv)?;
    let RotarySpec { seq, heads, head_dim, interleaved, position_offset, .. } = spec;
    let x = f32s_mut("rotary", "qkv", qkv)?;
    let token = heads * 3 * head_dim;
    if token == 0 || seq == 0 {
        return Ok(());
    }
    x.par_chunks_mut(token).enumerate().for_each(|(row, tok)| {
        let pos = position_offset + row % seq;
        let (cos, sin) = match inv_freq {
            Some(f) => angles_from(f, pos),
            None => angles(&spec, pos),
        };
        for head in tok.chunks_exact_mut(3 * head_dim) {
            // q is slot 0 and k slot 1 of (3, head_dim); v is left alone.
            let (qk, _v) = head.split_at_mut(2 * head_dim);
            for part in qk.chunks_exact_mut(head_dim) {
                rotate(part, &cos, &sin, interleaved, inverse);
            }
        }
    });
    Ok(())
}
