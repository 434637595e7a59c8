//! The masked-LM sample index (SPEC §2.11; Megatron's C++ `build_mapping`): rows
//! `(first_sentence, end_sentence_exclusive, target_len)` grouping each document's sentences
//! into samples of about `target_len` tokens, the targets drawn from `std::mt19937(seed)`
//! (short with probability `short_seq_prob`), over as many epochs as `num_samples` needs, then
//! shuffled with `std::mt19937_64(seed + 1)`.

use super::rng::Mt19937_64;
use crate::gpt::RandomState;
use anyhow::{bail, Result};

/// Documents with more than one sentence are skipped when one is longer than this.
pub const LONG_SENTENCE_LEN: i32 = 512;

/// `2 + r % (max_len - 1)` when the draw `r` falls in the short ratio, else `max_len`.
fn target_len(short_ratio: u32, max_len: i32, rng: &mut RandomState) -> i32 {
    if short_ratio == 0 {
        return max_len;
    }
    let r = rng.next_u32();
    if r.is_multiple_of(short_ratio) {
        2 + (r % (max_len as u32 - 1)) as i32
    } else {
        max_len
    }
}

/// `docs`: sentence boundaries of the split's documents (`document_indices[first..=last]`),
/// `sizes`: every sentence's length. Returns the `[n, 3]` rows.
pub fn build_mapping(
    docs: &[i64],
    sizes: &[i32],
    num_samples: u64,
    max_seq_length: i32,
    short_seq_prob: f64,
    seed: i32,
    min_num_sent: i64,
) -> Result<Vec<[u64; 3]>> {
    if max_seq_length <= 1 || !(0.0..=1.0).contains(&short_seq_prob) || seed <= 0 {
        bail!(
            "masked sample index: need max_seq_length > 1 ({max_seq_length}), short_seq_prob in [0, 1] \
             ({short_seq_prob}) and seed > 0 ({seed})"
        );
    }
    let short_ratio = if short_seq_prob > 0.0 { (1.0 / short_seq_prob).round() as u32 } else { 0 };
    let num_epochs = i32::MAX - 1;
    let mut rng = RandomState::new(seed as u32);
    let mut maps: Vec<[u64; 3]> = Vec::new();
    let mut any_eligible = false;
    'epochs: for _epoch in 0..num_epochs {
        if maps.len() as u64 >= num_samples {
            break;
        }
        for d in 0..docs.len().saturating_sub(1) {
            let (first, last) = (docs[d], docs[d + 1]);
            let mut remain = last - first;
            let long = remain > 1 && (first..last).any(|s| sizes[s as usize] > LONG_SENTENCE_LEN);
            if remain < min_num_sent || long {
                continue;
            }
            any_eligible = true;
            let mut prev = first;
            let (mut seq_len, mut num_sent) = (0i64, 0i64);
            let mut target = target_len(short_ratio, max_seq_length, &mut rng);
            for s in first..last {
                seq_len += sizes[s as usize] as i64;
                num_sent += 1;
                remain -= 1;
                if (seq_len >= target as i64 && remain > 1 && num_sent >= min_num_sent) || remain == 0 {
                    maps.push([prev as u64, (s + 1) as u64, target as u64]);
                    prev = s + 1;
                    target = target_len(short_ratio, max_seq_length, &mut rng);
                    seq_len = 0;
                    num_sent = 0;
                }
            }
        }
        if !any_eligible {
            break 'epochs;
        }
    }
    if maps.is_empty() {
        bail!("masked sample index: no document has enough sentences ({min_num_sent}) of at most {LONG_SENTENCE_LEN} tokens");
    }
    let mut rng64 = Mt19937_64::new(seed as u64 + 1);
    for i in (1..maps.len()).rev() {
        let j = (rng64.next_u64() % (i as u64 + 1)) as usize;
        maps.swap(i, j);
    }
    Ok(maps)
}
