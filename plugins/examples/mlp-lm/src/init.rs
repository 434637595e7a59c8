//! Deterministic parameter initialisation without extra dependencies: a SplitMix64 stream and
//! Box–Muller normals. Every parameter gets its own stream keyed by `(seed, parameter index)`,
//! so initial weights do not depend on the order parameters are created in.

/// SplitMix64 (Steele et al.), enough for weight initialisation.
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64, stream: u64) -> SplitMix64 {
        SplitMix64(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `(0, 1]` (never 0, so `ln` is finite).
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// `n` samples of `N(0, std²)`.
    pub fn normals(&mut self, n: usize, std: f32) -> Vec<f32> {
        let mut out = Vec::with_capacity(n + 1);
        while out.len() < n {
            let (u1, u2) = (self.uniform(), self.uniform());
            let r = (-2.0 * u1.ln()).sqrt();
            let t = 2.0 * std::f64::consts::PI * u2;
            out.push((r * t.cos()) as f32 * std);
            out.push((r * t.sin()) as f32 * std);
        }
        out.truncate(n);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normals_have_the_requested_moments() {
        let x = SplitMix64::new(7, 3).normals(20_000, 0.5);
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / x.len() as f64;
        let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / x.len() as f64;
        // Standard errors: mean 0.5/sqrt(2e4) ≈ 0.0035, variance ≈ 0.25*sqrt(2/2e4) ≈ 0.0025.
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var - 0.25).abs() < 0.015, "variance {var}");
    }

    #[test]
    fn streams_differ_and_repeat() {
        let a = SplitMix64::new(1, 0).normals(8, 1.0);
        assert_eq!(a, SplitMix64::new(1, 0).normals(8, 1.0));
        assert_ne!(a, SplitMix64::new(1, 1).normals(8, 1.0));
        assert_ne!(a, SplitMix64::new(2, 0).normals(8, 1.0));
    }
}
