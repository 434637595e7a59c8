//! The `single` sampler of SPEC §2.10: global sample indices from `consumed_samples` on,
//! in chunks of `micro_batch * dp`; data-parallel rank `r` takes positions `[r*mbs,
//! (r+1)*mbs)` of each chunk. Resuming is setting `consumed_samples`; no RNG state.

use anyhow::{bail, Context, Result};
use megatron_core::{Batch, Dataset};
use std::sync::Arc;

/// Reads microbatches of one split for one data-parallel rank.
#[derive(Clone)]
pub struct DataCursor {
    dataset: Arc<dyn Dataset>,
    split: &'static str,
    micro_batch_size: usize,
    dp_size: usize,
    dp_rank: usize,
}

impl DataCursor {
    pub fn new(
        dataset: Arc<dyn Dataset>,
        split: &'static str,
        micro_batch_size: usize,
        dp_size: usize,
        dp_rank: usize,
    ) -> Self {
        DataCursor { dataset, split, micro_batch_size, dp_size, dp_rank }
    }

    /// Microbatch `microbatch` of the global batch that starts at `consumed` samples.
    pub fn microbatch(&self, consumed: u64, microbatch: usize, seed: u64) -> Result<Batch> {
        let mbs = self.micro_batch_size;
        let start = consumed as usize + microbatch * mbs * self.dp_size + self.dp_rank * mbs;
        if start + mbs > self.dataset.len() {
            bail!(
                "the {} dataset `{}` has {} samples but sample {} was requested; \
                 the dataset is smaller than --train-iters x --global-batch-size (or the eval counts) need",
                self.split,
                self.dataset.name(),
                self.dataset.len(),
                start + mbs - 1
            );
        }
        let mut batch =
            Batch { micro_batch_size: mbs, seq_length: 0, tokens: vec![], labels: vec![], loss_mask: vec![], seed };
        for i in start..start + mbs {
            let s = self.dataset.get(i).with_context(|| format!("reading {} sample {i}", self.split))?;
            if batch.seq_length == 0 {
                batch.seq_length = s.tokens.len();
            } else if s.tokens.len() != batch.seq_length {
                bail!("{} sample {i} has {} tokens, expected {}", self.split, s.tokens.len(), batch.seq_length);
            }
            batch.tokens.extend_from_slice(&s.tokens);
            batch.labels.extend_from_slice(&s.labels);
            batch.loss_mask.extend_from_slice(&s.loss_mask);
        }
        Ok(batch)
    }
}

/// Dropout seed of one microbatch: a pure function of `(seed, iteration, microbatch)` so a
/// resumed run draws the same masks (splitmix64 finaliser for good bit mixing).
pub fn microbatch_seed(seed: u64, iteration: u64, microbatch: usize) -> u64 {
    let mut z =
        seed ^ iteration.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (microbatch as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
