//! Shared by the BERT model tests: one small padded, masked batch.

use megatron_bert::BertBatch;

/// 3 rows of 8 positions with 8, 5 and 3 real tokens, a few masked positions per row.
/// `shift` moves the tokens and the masked positions (0 for the plain batch); `seed` is the
/// batch's dropout seed.
pub fn masked_batch(shift: usize, seed: u64) -> BertBatch {
    let (b, s) = (3, 8);
    let lengths = vec![8, 5, 3];
    let mut tokens = vec![0; b * s];
    let mut types = vec![0; b * s];
    let mut labels = vec![0; b * s];
    let mut loss_mask = vec![0.0; b * s];
    for (r, &len) in lengths.iter().enumerate() {
        for t in 0..len {
            let i = r * s + t;
            tokens[i] = ((r * 7 + t * 13 + shift) % 50) as i32;
            types[i] = (t >= len / 2) as i32;
            if (t + r + shift) % 3 == 1 {
                labels[i] = ((r * 11 + t * 5 + 3) % 50) as i32;
                loss_mask[i] = 1.0;
            }
        }
    }
    BertBatch { batch: b, seq: s, tokens, types, lengths, labels, loss_mask, is_random: vec![1, 0, 1], seed }
}
