//! The random streams Megatron's masked-LM sample index and T5 masking draw from (SPEC §2.11,
//! §2.12): C++ `std::mt19937` (32-bit; the same generator and seeding as numpy's MT19937) and
//! `std::mt19937_64` for the index, and numpy's legacy `RandomState` draws `random_sample`
//! and `geometric` (inversion for `p < 1/3`) per sample, on top of [`RandomState`].

use crate::gpt::RandomState;

/// C++ `std::mt19937_64` (Matsumoto–Nishimura 64-bit Mersenne Twister, `seed(uint64)`).
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

    pub fn next_u64(&mut self) -> u64 {
        const UM: u64 = 0xFFFF_FFFF_8000_0000;
        const LM: u64 = 0x7FFF_FFFF;
        if self.pos >= 312 {
            for i in 0..312 {
                let x = (self.mt[i] & UM) | (self.mt[(i + 1) % 312] & LM);
                let mag = if x & 1 == 1 { 0xB502_6F5A_A966_19E9 } else { 0 };
                self.mt[i] = self.mt[(i + 156) % 312] ^ (x >> 1) ^ mag;
            }
            self.pos = 0;
        }
        let mut x = self.mt[self.pos];
        self.pos += 1;
        x ^= (x >> 29) & 0x5555_5555_5555_5555;
        x ^= (x << 17) & 0x71D6_7FFF_EDA6_0000;
        x ^= (x << 37) & 0xFFF7_EEE0_0000_0000;
        x ^ (x >> 43)
    }
}

/// numpy `RandomState.random_sample()`: 53 random bits in `[0, 1)`.
pub fn random_sample(rs: &mut RandomState) -> f64 {
    let a = rs.next_u32() >> 5;
    let b = rs.next_u32() >> 6;
    (a as f64 * 67_108_864.0 + b as f64) / 9_007_199_254_740_992.0
}

/// numpy legacy `RandomState.geometric(p)` (support >= 1): inversion
/// `ceil(log1p(-U) / log(1 - p))` for `p < 1/3`, sequential search otherwise.
pub fn geometric(rs: &mut RandomState, p: f64) -> i64 {
    if p >= 0.333_333_333_333_333_3 {
        let mut x = 1i64;
        let mut prod = p;
        let mut sum = p;
        let q = 1.0 - p;
        let u = random_sample(rs);
        while u > sum {
            prod *= q;
            sum += prod;
            x += 1;
        }
        return x;
    }
    ((-random_sample(rs)).ln_1p() / (1.0 - p).ln()).ceil() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 10000th output of `std::mt19937_64` default-seeded (5489) is 9981545732273789042
    /// (the C++ standard's check value, [rand.predef]).
    #[test]
    fn mt19937_64_matches_the_standard_check_value() {
        let mut g = Mt19937_64::new(5489);
        let mut v = 0;
        for _ in 0..10000 {
            v = g.next_u64();
        }
        assert_eq!(v, 9_981_545_732_273_789_042);
    }

    /// The 10000th output of `std::mt19937` default-seeded (5489) is 4123659995 ([rand.predef]):
    /// numpy's MT19937 with a 32-bit seed is the same generator.
    #[test]
    fn mt19937_matches_the_standard_check_value() {
        let mut g = RandomState::new(5489);
        let mut v = 0;
        for _ in 0..10000 {
            v = g.next_u32();
        }
        assert_eq!(v, 4_123_659_995);
    }
}
