//! The `mock` dataset plugin, for runs and tests without data. Like Megatron's
//! `MockGPTDataset` (SPEC §2.9) its token stream is made of synthetic documents
//! `[1, 2, ..., len-1, eod]` (ids wrap below the eod id `vocab_size - 1`), so a model can
//! learn it and the loss falls. Unlike Megatron's, sample `i` is a pure function of
//! `(seed, split, i)` (a ChaCha stream keyed by seed and split, stream number `i`, draws the
//! document lengths in `1..=max(seq_length, 2)` and the offset into the first document), so
//! any sample can be read in any order, on any rank, without an index.

use crate::split::SPLIT_NAMES;
use anyhow::{anyhow, bail};
use megatron_core::{Dataset, DatasetSplits, Result, Sample};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;
use std::sync::Arc;

/// The registered name.
pub const NAME: &str = "mock";

fn default_seed() -> u64 {
    1234
}

/// Config of the `mock` dataset plugin.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MockDatasetConfig {
    pub seq_length: usize,
    /// Ids are drawn from `0..vocab_size`.
    pub vocab_size: usize,
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Samples `[train, valid, test]`; a split with 0 samples is absent.
    pub num_samples: [u64; 3],
}

/// One split of random samples.
#[derive(Clone, Debug)]
pub struct MockDataset {
    name: String,
    split: u64,
    seq_length: usize,
    vocab_size: usize,
    seed: u64,
    len: usize,
}

impl MockDataset {
    /// `split` is 0 (train), 1 (valid) or 2 (test).
    pub fn new(config: &MockDatasetConfig, split: usize) -> Result<MockDataset> {
        if config.seq_length == 0 || config.vocab_size == 0 {
            bail!("dataset `mock`: seq_length and vocab_size must be at least 1");
        }
        if config.vocab_size > i32::MAX as usize {
            bail!("dataset `mock`: vocab_size {} exceeds the i32 token range", config.vocab_size);
        }
        let name = SPLIT_NAMES.get(split).ok_or_else(|| anyhow!("dataset `mock`: split {split} is not 0, 1 or 2"))?;
        Ok(MockDataset {
            name: format!("mock:{name}"),
            split: split as u64,
            seq_length: config.seq_length,
            vocab_size: config.vocab_size,
            seed: config.seed,
            len: usize::try_from(config.num_samples[split])?,
        })
    }

    /// The `seq_length + 1` ids of sample `index`.
    fn ids(&self, index: usize) -> Vec<i32> {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&self.seed.to_le_bytes());
        key[8..16].copy_from_slice(&self.split.to_le_bytes());
        key[16..].copy_from_slice(b"megatron-mock-v1");
        let mut rng = ChaCha8Rng::from_seed(key);
        rng.set_stream(index as u64);
        let eod = self.vocab_size as i32 - 1;
        // Ids 1..eod-1 cycle inside a document; with a vocabulary of 1 or 2 only eod/1 remain.
        let span = (self.vocab_size as i64 - 2).max(1);
        let max_len = self.seq_length.max(2);
        let mut ids = Vec::with_capacity(self.seq_length + 1);
        let mut pos = rng.gen_range(0..max_len); // offset into the first document
        let mut len = rng.gen_range(pos + 1..=max_len);
        while ids.len() <= self.seq_length {
            let id = if pos + 1 == len { eod } else { (1 + (pos as i64 % span)) as i32 };
            ids.push(id.min(eod).max(0));
            pos += 1;
            if pos == len {
                pos = 0;
                len = rng.gen_range(1..=max_len);
            }
        }
        ids
    }
}

impl Dataset for MockDataset {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> Result<Sample> {
        if index >= self.len {
            bail!("{}: sample {index} is out of range; the split has {} samples", self.name, self.len);
        }
        let ids = self.ids(index);
        Ok(Sample {
            tokens: ids[..self.seq_length].to_vec(),
            labels: ids[1..].to_vec(),
            loss_mask: vec![1.0; self.seq_length],
        })
    }
}

/// The three splits of the `mock` plugin.
pub fn build_mock_splits(config: &MockDatasetConfig) -> Result<DatasetSplits> {
    let split = |k: usize| -> Result<Option<Arc<dyn Dataset>>> {
        if config.num_samples[k] == 0 {
            return Ok(None);
        }
        Ok(Some(Arc::new(MockDataset::new(config, k)?)))
    };
    Ok(DatasetSplits { train: split(0)?, valid: split(1)?, test: split(2)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(seed: u64) -> MockDatasetConfig {
        MockDatasetConfig { seq_length: 16, vocab_size: 50, seed, num_samples: [8, 4, 0] }
    }

    #[test]
    fn samples_are_deterministic_shifted_and_in_range() -> Result<()> {
        let a = MockDataset::new(&config(7), 0)?;
        let b = MockDataset::new(&config(7), 0)?;
        // Reading order does not matter.
        let late = b.get(5)?;
        assert_eq!(a.get(5)?, late);
        let s = a.get(3)?;
        assert_eq!(s.tokens[1..], s.labels[..15]);
        assert_eq!(s.loss_mask, vec![1.0; 16]);
        assert!(s.tokens.iter().chain(&s.labels).all(|&t| (0..50).contains(&t)));
        assert_ne!(a.get(3)?, a.get(4)?);
        // Inside a document the next id is the previous one plus 1 (learnable), eod = 49.
        let steps = s.tokens.windows(2).filter(|w| w[1] == w[0] + 1 || w[1] == 49 || w[0] == 49).count();
        assert_eq!(steps, 15, "{:?}", s.tokens);
        assert!(a.get(8).is_err());
        Ok(())
    }

    #[test]
    fn seed_and_split_change_the_samples() -> Result<()> {
        let train = MockDataset::new(&config(7), 0)?;
        assert_ne!(train.get(0)?, MockDataset::new(&config(8), 0)?.get(0)?);
        assert_ne!(train.get(0)?, MockDataset::new(&config(7), 1)?.get(0)?);
        let splits = build_mock_splits(&config(7))?;
        assert_eq!(splits.train.map(|d| d.len()), Some(8));
        assert_eq!(splits.valid.map(|d| d.len()), Some(4));
        assert!(splits.test.is_none());
        Ok(())
    }
}
