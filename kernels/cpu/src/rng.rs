//! Counter-based random numbers for dropout: a mask bit is a pure function of
//! `(seed, element index)`, so kernels generate it in any order, in parallel, and backward
//! regenerates exactly the forward mask instead of storing it.

/// The splitmix64 finaliser (Steele et al.): a bijective 64-bit mixer with full avalanche.
#[inline(always)]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// A dropout stream: element `i` of the splitmix64 sequence started from a mixed `seed`.
#[derive(Clone, Copy, Debug)]
pub struct DropoutMask {
    key: u64,
    threshold: u32,
    /// `1/(1-p)`: the scale of kept elements (inverted dropout).
    pub scale: f32,
}

impl DropoutMask {
    /// Keep probability `1-p`; `p` must be in `[0, 1)` (checked by the callers).
    pub fn new(seed: u64, p: f32) -> DropoutMask {
        // 24 random bits compared with p·2^24: exact for every p that is a multiple of 2^-24.
        let threshold = (p as f64 * (1u64 << 24) as f64).round() as u32;
        DropoutMask { key: mix64(seed ^ 0x5851_F42D_4C95_7F2D), threshold, scale: 1.0 / (1.0 - p) }
    }

    /// Whether element `index` is kept.
    #[inline(always)]
    pub fn keep(&self, index: u64) -> bool {
        let h = mix64(self.key.wrapping_add(index.wrapping_add(1).wrapping_mul(GOLDEN)));
        ((h >> 40) as u32) >= self.threshold
    }

    /// The multiplier of element `index`: `scale` when kept, 0 when dropped.
    #[inline(always)]
    pub fn factor(&self, index: u64) -> f32 {
        if self.keep(index) {
            self.scale
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_rate_matches_p_and_depends_on_seed() {
        let n = 200_000u64;
        let m = DropoutMask::new(7, 0.3);
        let kept = (0..n).filter(|&i| m.keep(i)).count() as f64 / n as f64;
        // Binomial std at n=2e5 is ~0.001; 0.01 is 10 sigma.
        assert!((kept - 0.7).abs() < 0.01, "kept fraction {kept}");
        let other = DropoutMask::new(8, 0.3);
        let same = (0..1000u64).filter(|&i| m.keep(i) == other.keep(i)).count();
        assert!(same < 800, "seeds 7 and 8 give nearly identical masks ({same}/1000)");
        assert!((0..1000u64).all(|i| DropoutMask::new(3, 0.0).keep(i)));
    }
}
