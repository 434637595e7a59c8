//! Parameter creation: every tensor is drawn whole from its own seed, a hash of the base seed
//! and its name (the scheme of megatron-transformer's `init`), so an expert's initial weights
//! depend on its *global* expert id only — not on the expert-parallel size or the rank.

use anyhow::{anyhow, Result};
use megatron_core::{Backend, DType, HostBuffer, Param, ParamLayout};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a of the name mixed with the base seed.
pub fn param_seed(base_seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix64(h ^ mix64(base_seed))
}

/// A replicated (not tensor-parallel) weight `~ N(0, std²)` with a zero gradient.
pub fn normal_param(backend: &dyn Backend, name: &str, shape: &[usize], std: f32, seed: u64) -> Result<Param> {
    let numel = shape.iter().product();
    let normal = Normal::new(0.0f32, std).map_err(|e| anyhow!("invalid init std {std} for `{name}`: {e}"))?;
    let mut rng = ChaCha8Rng::seed_from_u64(param_seed(seed, name));
    let values: Vec<f32> = (0..numel).map(|_| normal.sample(&mut rng)).collect();
    Ok(Param {
        name: name.to_string(),
        value: backend.from_host(HostBuffer::F32(values), shape)?,
        grad: backend.zeros(shape, DType::F32)?,
        layout: ParamLayout::replicated(shape, false),
    })
}
