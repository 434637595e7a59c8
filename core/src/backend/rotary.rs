//! [`RotaryOps`]: rotary position embedding ([`RotarySpec`]), plain and with rescaled
//! frequencies (Llama-3.1 / linear context extension).

use super::MemoryOps;
use crate::{DeviceTensor, HostBuffer, Result};

/// Rotary position embedding applied to the q and k parts of a fused `(B,T,heads,3,hd)` QKV.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RotarySpec {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Rotated channels (`head_dim * rotary_percent`), even.
    pub rotary_dim: usize,
    pub base: f32,
    /// Adjacent pairs `(2i, 2i+1)` instead of the two halves.
    pub interleaved: bool,
    /// Position of token 0 (for generation with a cache).
    pub position_offset: usize,
}

/// Rotary position embedding of the q and k parts of a fused QKV, in place.
pub trait RotaryOps: MemoryOps {
    /// Rotates q and k in place; `inverse` applies the transpose rotation (the backward).
    fn rotary(&self, qkv: &mut DeviceTensor, spec: RotarySpec, inverse: bool) -> Result<()>;
    /// [`RotaryOps::rotary`] with the frequencies `scaling.inv_freq(spec.base, spec.rotary_dim)`
    /// (see [`crate::rope_scaling`]). `RopeScaling::None` is exactly [`RotaryOps::rotary`]; the
    /// default of a scaled rotation goes through the host ([`crate::rope_scaling::rotary_host`],
    /// exact, a copy) and keeps the tensor's dtype; backends override it.
    fn rotary_scaled(
        &self,
        qkv: &mut DeviceTensor,
        spec: RotarySpec,
        scaling: crate::RopeScaling,
        inverse: bool,
    ) -> Result<()> {
        if scaling.is_none() {
            return self.rotary(qkv, spec, inverse);
        }
        let dtype = qkv.dtype();
        let mut x = self.to_host(qkv)?.to_f32_vec();
        crate::rope_scaling::rotary_host(&mut x, &spec, &scaling.inv_freq(spec.base, spec.rotary_dim), inverse)?;
        let shape = qkv.shape().to_vec();
        let f32_tensor = self.from_host(HostBuffer::F32(x), &shape)?;
        if dtype == crate::DType::F32 {
            *qkv = f32_tensor;
            Ok(())
        } else {
            self.cast(&f32_tensor, qkv)
        }
    }
}
