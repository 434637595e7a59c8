//! numpy's legacy `RandomState` as far as Megatron's GPT indices use it (SPEC §2.7): MT19937
//! seeded with `init_genrand(seed)` and the in-place Fisher–Yates `shuffle` with rejection-
//! sampled bounded draws. Sharing numpy's stream makes the sample order Megatron's.

const N: usize = 624;
const M: usize = 397;

/// MT19937 with numpy's 32-bit seeding.
pub struct RandomState {
    mt: [u32; N],
    pos: usize,
}

impl RandomState {
    /// `numpy.random.RandomState(seed)` for a 32-bit integer seed.
    pub fn new(seed: u32) -> RandomState {
        let mut mt = [0u32; N];
        mt[0] = seed;
        for i in 1..N {
            mt[i] = 1_812_433_253u32.wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_add(i as u32);
        }
        RandomState { mt, pos: N }
    }

    fn twist(&mut self) {
        const UPPER: u32 = 0x8000_0000;
        const LOWER: u32 = 0x7fff_ffff;
        for i in 0..N {
            let y = (self.mt[i] & UPPER) | (self.mt[(i + 1) % N] & LOWER);
            let mag = if y & 1 == 1 { 0x9908_b0df } else { 0 };
            self.mt[i] = self.mt[(i + M) % N] ^ (y >> 1) ^ mag;
        }
        self.pos = 0;
    }

    /// The next tempered 32-bit output.
    pub fn next_u32(&mut self) -> u32 {
        if self.pos >= N {
            self.twist();
        }
        let mut y = self.mt[self.pos];
        self.pos += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    fn next_u64(&mut self) -> u64 {
        // numpy's legacy `next_uint64` for MT19937: high word first.
        (u64::from(self.next_u32()) << 32) | u64::from(self.next_u32())
    }

    /// A uniform integer in `[0, max]` (numpy's `random_interval`).
    pub fn bounded(&mut self, max: u64) -> u64 {
        if max == 0 {
            return 0;
        }
        let mut mask = max;
        for shift in [1, 2, 4, 8, 16, 32] {
            mask |= mask >> shift;
        }
        loop {
            let v = if max <= u64::from(u32::MAX) { u64::from(self.next_u32()) & mask } else { self.next_u64() & mask };
            if v <= max {
                return v;
            }
        }
    }

    /// `RandomState.shuffle` of a 1-D array.
    pub fn shuffle<T>(&mut self, a: &mut [T]) {
        for i in (1..a.len()).rev() {
            let j = self.bounded(i as u64) as usize;
            a.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RandomState;

    #[test]
    fn matches_numpy_shuffle_of_arange_20_seed_1234() {
        let mut a: Vec<u32> = (0..20).collect();
        RandomState::new(1234).shuffle(&mut a);
        assert_eq!(a, [3, 13, 2, 16, 14, 5, 4, 0, 8, 18, 17, 11, 10, 9, 7, 1, 19, 12, 6, 15]);
    }

    #[test]
    fn matches_the_reference_mt19937_output() {
        // First output of the reference MT19937 seeded with init_genrand(5489).
        assert_eq!(RandomState::new(5489).next_u32(), 3_499_211_612);
    }
}
