//! The generic [`Batch`] of `megatron pretrain --model bert` as a [`BertBatch`]. The training
//! loop's batch has only tokens, labels and a loss mask, so the `bert` dataset
//! (`datasets/src/bert/plugin.rs`) packs BERT's extra fields into a second half of every row;
//! for `--seq-length s` a row has `2s` positions:
//! * `tokens    = [text (s) | types (s)]`
//! * `labels    = [labels (s) | is_random, 0 × (s − 1)]`
//! * `loss_mask = [loss_mask (s) | padding_mask as 1.0 / 0.0 (s)]`
//!
//! A row's length (what the padding-mask attention takes) is one past its last padding-mask
//! 1 (Megatron's mask is a prefix, except where a random replacement drew `[PAD]`).

use crate::model::BertBatch;
use anyhow::{bail, Result};
use megatron_core::Batch;

impl BertBatch {
    /// Reads a batch in the packed layout of sequence length `seq` (module docs).
    pub fn unpack(b: &Batch, seq: usize) -> Result<BertBatch> {
        let (rows, width) = (b.micro_batch_size, 2 * seq);
        if b.seq_length != width {
            bail!(
                "the bert model reads the packed samples of the `bert` dataset ({width} positions per row for \
                 --seq-length {seq}), got rows of {}: train it with `--model bert` on a sentence-split --data-path",
                b.seq_length
            );
        }
        let n = rows * width;
        if b.tokens.len() != n || b.labels.len() != n || b.loss_mask.len() != n {
            bail!(
                "bert batch of {rows}x{width}: {} tokens, {} labels, {} loss-mask entries (all must be {n})",
                b.tokens.len(),
                b.labels.len(),
                b.loss_mask.len()
            );
        }
        let mut x = BertBatch {
            batch: rows,
            seq,
            tokens: Vec::with_capacity(rows * seq),
            types: Vec::with_capacity(rows * seq),
            lengths: Vec::with_capacity(rows),
            labels: Vec::with_capacity(rows * seq),
            loss_mask: Vec::with_capacity(rows * seq),
            is_random: Vec::with_capacity(rows),
            seed: b.seed,
        };
        for r in 0..rows {
            let (first, second) = (r * width..r * width + seq, r * width + seq..(r + 1) * width);
            x.tokens.extend_from_slice(&b.tokens[first.clone()]);
            x.types.extend_from_slice(&b.tokens[second.clone()]);
            x.labels.extend_from_slice(&b.labels[first.clone()]);
            x.loss_mask.extend_from_slice(&b.loss_mask[first]);
            let padding = &b.loss_mask[second.clone()];
            let Some(last) = padding.iter().rposition(|&m| m != 0.0) else {
                bail!("bert batch row {r} has an empty padding mask (no real tokens)");
            };
            x.lengths.push(last + 1);
            x.is_random.push(b.labels[second.start]);
        }
        Ok(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpacks_rows() {
        let b = Batch {
            micro_batch_size: 2,
            seq_length: 8,
            tokens: vec![2, 7, 3, 0, 0, 0, 0, 0, 2, 5, 3, 6, 0, 0, 1, 1],
            labels: vec![0, 8, 0, 0, 1, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0],
            loss_mask: vec![0., 1., 0., 0., 1., 1., 1., 0., 0., 0., 0., 1., 1., 1., 1., 1.],
            seed: 5,
        };
        let x = BertBatch::unpack(&b, 4).unwrap();
        assert_eq!(x.tokens, [2, 7, 3, 0, 2, 5, 3, 6]);
        assert_eq!(x.types, [0, 0, 0, 0, 0, 0, 1, 1]);
        assert_eq!(x.labels, [0, 8, 0, 0, 0, 0, 0, 9]);
        assert_eq!(x.loss_mask, [0., 1., 0., 0., 0., 0., 0., 1.]);
        assert_eq!(x.lengths, [3, 4]);
        assert_eq!(x.is_random, [1, 0]);
        assert_eq!(x.seed, 5);
        let wrong = Batch { seq_length: 4, micro_batch_size: 4, ..b.clone() };
        assert!(BertBatch::unpack(&wrong, 4).unwrap_err().to_string().contains("packed samples"));
        let mut empty = b;
        empty.loss_mask[4..8].fill(0.0);
        assert!(BertBatch::unpack(&empty, 4).unwrap_err().to_string().contains("row 0"));
    }
}
