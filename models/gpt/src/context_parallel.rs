//! Context parallelism in the GPT model (SPEC §5.9): each CP rank takes its two chunks of every
//! microbatch's sequence (Megatron's `get_batch_on_this_cp_rank`, chunks `r` and `2cp−1−r` of
//! `2·cp`, see `megatron_transformer::context_parallel`), runs every layer on those `T/cp`
//! tokens (the attention is the ring over the CP group), and the loss report is summed over the
//! CP group so every CP rank reports the whole microbatch.
//!
//! Gradient scale: each CP rank's backward gives the gradient of its own tokens' share of the
//! loss; the sum over CP ranks is the true gradient. The data-parallel reduction pre-scales by
//! `1/(dp·cp)` and sums over DP×CP (SPEC §5.6), so the backward starts from `cp` times the
//! per-token scale (Megatron multiplies the loss by the CP size for the same reason).

use anyhow::{bail, Result};
use megatron_core::{Batch, ParallelContext};
use megatron_transformer::context_parallel::{check_sequence, local_positions};
use megatron_transformer::init::mix64;

/// The part of `batch` CP rank `ctx.cp_rank` works on: `(B, T/cp)` tokens, labels and loss
/// mask at its chunks' positions; the dropout seed mixed with the CP rank (its tokens differ
/// from the other CP ranks', so its masks must too).
pub(crate) fn local_batch(batch: &Batch, ctx: &ParallelContext) -> Result<Batch> {
    let (cp, rank, s) = (ctx.grid.cp, ctx.cp_rank, batch.seq_length);
    check_sequence(s, cp)?;
    let n = batch.micro_batch_size * s;
    if batch.tokens.len() != n || batch.labels.len() != n || batch.loss_mask.len() != n {
        bail!(
            "batch of {}x{s} has {} tokens, {} labels and {} loss-mask entries; all must be {n}",
            batch.micro_batch_size,
            batch.tokens.len(),
            batch.labels.len(),
            batch.loss_mask.len()
        );
    }
    let pos = local_positions(s, cp, rank);
    let pick = |row: usize| pos.iter().map(move |&p| row * s + p);
    let rows = 0..batch.micro_batch_size;
    Ok(Batch {
        micro_batch_size: batch.micro_batch_size,
        seq_length: s / cp,
        tokens: rows.clone().flat_map(pick).map(|i| batch.tokens[i]).collect(),
        labels: rows.clone().flat_map(pick).map(|i| batch.labels[i]).collect(),
        loss_mask: rows.flat_map(pick).map(|i| batch.loss_mask[i]).collect(),
        seed: mix64(batch.seed ^ ((rank as u64 + 1) << 52)),
    })
}
