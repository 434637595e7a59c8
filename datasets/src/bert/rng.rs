//! The random draws Megatron's BERT dataset makes (SPEC §2.11): C++ `std::mt19937_64` for the
//! sample shuffle, and numpy's legacy `RandomState` draws beyond `shuffle` (`random()`,
//! `randint`, `choice(p=…)`) as an extension of [`crate::gpt::RandomState`]. `std::mt19937`
//! seeded with `s` is the same generator as `RandomState(s)` (both use `init_genrand`), so
//! its raw 32-bit outputs are [`RandomState::next_u32`].

use crate::gpt::RandomState;

/// C++ `std::mt19937_64` (the standard's parameters and seeding).
pub struct Mt19937_64 {
    mt: [u64; 312],
    pos: usize,
}

impl Mt19937_64 {
    pub fn new(seed: u64) -> Mt19937_64 {
        let mut mt = [0u64; 312];
        mt[0] = seed;
        for i in 1..312 {
            mt[i] = 6_364_136_223_846_793_005u64.wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 62)).wrapping_add(i as u64);
        }
        Mt19937_64 { mt, pos: 312 }
    }

    fn twist(&mut self) {
        const UPPER: u64 = 0xFFFF_FFFF_8000_0000;
        const LOWER: u64 = 0x7FFF_FFFF;
        for i in 0..312 {
            let y = (self.mt[i] & UPPER) | (self.mt[(i + 1) % 312] & LOWER);
            let mag = if y & 1 == 1 { 0xB502_6F5A_A966_19E9 } else { 0 };
            self.mt[i] = self.mt[(i + 156) % 312] ^ (y >> 1) ^ mag;
        }
        self.pos = 0;
    }

    pub fn next_u64(&mut self) -> u64 {
        if self.pos >= 312 {
            self.twist();
        }
        let mut y = self.mt[self.pos];
        self.pos += 1;
        y ^= (y >> 29) & 0x5555_5555_5555_5555;
        y ^= (y << 17) & 0x71D6_7FFF_EDA6_0000;
        y ^= (y << 37) & 0xFFF7_EEE0_0000_0000;
        y ^ (y >> 43)
    }
}

/// numpy legacy `RandomState` draws used by `BERTMaskedWordPieceDataset.__getitem__`.
pub trait NumpyDraws {
    /// `random()`: a double in `[0, 1)` from two 32-bit outputs (53 bits).
    fn random(&mut self) -> f64;
    /// `randint(low, high)`: uniform in `[low, high)` by masked rejection sampling.
    fn randint(&mut self, low: i64, high: i64) -> i64;
    /// `choice(len(p), p=p)`: the index whose cumulative probability first exceeds one
    /// `random()` draw (numpy's `cdf.searchsorted(u, side='right')` after `cdf /= cdf[-1]`).
    fn choice_p(&mut self, p: &[f64]) -> usize;
}

impl NumpyDraws for RandomState {
    fn random(&mut self) -> f64 {
        let a = (self.next_u32() >> 5) as f64;
        let b = (self.next_u32() >> 6) as f64;
        (a * 67_108_864.0 + b) / 9_007_199_254_740_992.0
    }

    fn randint(&mut self, low: i64, high: i64) -> i64 {
        low + self.bounded((high - low - 1) as u64) as i64
    }

    fn choice_p(&mut self, p: &[f64]) -> usize {
        let mut cdf: Vec<f64> = p
            .iter()
            .scan(0.0, |acc, &v| {
                *acc += v;
                Some(*acc)
            })
            .collect();
        let last = cdf[cdf.len() - 1];
        cdf.iter_mut().for_each(|c| *c /= last);
        let u = self.random();
        cdf.iter().filter(|&&c| c <= u).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mt19937_64_matches_the_cpp_standard() {
        // [rand.predef]: the 10000th output of a default-constructed (seed 5489) mt19937_64.
        let mut g = Mt19937_64::new(5489);
        let v = (0..10_000).map(|_| g.next_u64()).last();
        assert_eq!(v, Some(9_981_545_732_273_789_042));
    }

    #[test]
    fn mt19937_matches_the_cpp_standard() {
        // [rand.predef]: the 10000th output of a default-constructed (5489) mt19937.
        let mut g = RandomState::new(5489);
        let v = (0..10_000).map(|_| g.next_u32()).last();
        assert_eq!(v, Some(4_123_659_995));
    }

    #[test]
    fn numpy_draws_match_numpy() {
        // numpy 2.4: RandomState(1234).random() twice, .randint(0, 30522) and .randint(1, 5).
        let mut r = RandomState::new(1234);
        assert_eq!(r.random(), 0.1915194503788923);
        assert_eq!(r.random(), 0.6221087710398319);
        let mut r = RandomState::new(7);
        assert_eq!(r.randint(0, 30522), 28847);
        // RandomState(3).choice([1, 2, 3], p=1/n normalised) twelve times.
        let mut r = RandomState::new(3);
        let p = [1.0, 0.5, 1.0 / 3.0];
        let sum: f64 = p.iter().sum();
        let got: Vec<usize> = (0..12).map(|_| r.choice_p(&p.map(|v| v / sum)) + 1).collect();
        assert_eq!(got, [2, 2, 1, 1, 3, 3, 1, 1, 1, 1, 1, 1]);
    }
}
