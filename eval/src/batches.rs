//! Running forwards through the TP ranks and scoring chosen positions: each rank runs in its
//! own thread (as ranks do) over the same sequence of [`RowBatch`]es, reduces its vocab slice
//! at the scored rows ([`crate::score::slice_stats`]), and the caller's thread merges the
//! slices in rank order ([`crate::score::combine`]), so results do not depend on thread timing.
//!
//! Two ways to get the rows' logits: the whole `(b, s, V/tp)` logits of
//! [`LogitsRank::host_logits`] (`full_logits`, the first implementation), or only the scored
//! rows from [`LogitsRank::host_logits_rows`] (the output layer runs on those rows alone when
//! the model supports it, see `Model::logits_rows`).

use crate::score::{combine, slice_stats, SliceStats, TokenScore};
use anyhow::{bail, Context, Result};
use megatron_core::{Backend, Model};
use std::sync::{mpsc, Arc};

/// One TP rank of the model under evaluation: host logits of its vocab slice (rank `r` of `tp`
/// holds ids `[r·V/tp, (r+1)·V/tp)`).
pub trait LogitsRank: Send {
    /// `(b, s, V_padded/tp)` logits of `tokens (b, s)`.
    fn host_logits(&mut self, tokens: &[i32], batch: usize, seq: usize) -> Result<Vec<f32>>;

    /// `(rows.len(), V_padded/tp)` logits at the flat positions `rows` (`b * seq + t`). The
    /// default takes them from [`LogitsRank::host_logits`].
    fn host_logits_rows(&mut self, tokens: &[i32], batch: usize, seq: usize, rows: &[usize]) -> Result<Vec<f32>> {
        let full = self.host_logits(tokens, batch, seq)?;
        gather_rows(&full, batch * seq, rows)
    }
}

/// Rows `rows` of the `(n, v)` matrix `full`.
fn gather_rows(full: &[f32], n: usize, rows: &[usize]) -> Result<Vec<f32>> {
    let v = full.len() / n.max(1);
    if v == 0 || full.len() != n * v {
        bail!("{} logits do not split into {n} rows", full.len());
    }
    let mut out = Vec::with_capacity(rows.len() * v);
    for &r in rows {
        if r >= n {
            bail!("logits row {r} is outside the {n} rows");
        }
        out.extend_from_slice(&full[r * v..(r + 1) * v]);
    }
    Ok(out)
}

/// Any [`Model`] with the backend its tensors live on.
pub struct ModelRank<M: Model> {
    pub model: M,
    pub backend: Arc<dyn Backend>,
}

impl<M: Model> LogitsRank for ModelRank<M> {
    fn host_logits(&mut self, tokens: &[i32], batch: usize, seq: usize) -> Result<Vec<f32>> {
        let logits = self.model.logits(tokens, batch, seq)?;
        Ok(self.backend.to_host(&logits)?.to_f32_vec())
    }

    fn host_logits_rows(&mut self, tokens: &[i32], batch: usize, seq: usize, rows: &[usize]) -> Result<Vec<f32>> {
        match self.model.logits_rows(tokens, batch, seq, rows)? {
            Some(t) => Ok(self.backend.to_host(&t)?.to_f32_vec()),
            None => gather_rows(&self.host_logits(tokens, batch, seq)?, batch * seq, rows),
        }
    }
}

/// One forward: inputs `(b, s)` and the scored flat positions with their target ids.
pub struct RowBatch {
    pub b: usize,
    pub s: usize,
    pub tokens: Vec<i32>,
    /// Flat positions `r * s + t` (strictly increasing).
    pub rows: Vec<usize>,
    /// The target id at each of `rows`.
    pub labels: Vec<i32>,
}

/// Logits-source and vocabulary settings of [`score_batches`].
#[derive(Clone, Copy, Debug)]
pub struct RowOptions {
    /// Unpadded vocabulary: larger ids are padding and never predicted.
    pub vocab_size: usize,
    /// Take the rows from the whole `(b, s, V/tp)` logits (the original path).
    pub full_logits: bool,
}

/// One rank's slice statistics of batch `mb`.
fn rank_stats(rank: &mut dyn LogitsRank, r: usize, mb: &RowBatch, opts: RowOptions) -> Result<SliceStats> {
    let n = mb.rows.len();
    if opts.full_logits {
        let logits = rank.host_logits(&mb.tokens, mb.b, mb.s)?;
        let v_local = logits.len() / (mb.b * mb.s).max(1);
        if v_local == 0 || logits.len() != mb.b * mb.s * v_local {
            bail!("rank {r} returned {} logits for a {}x{} batch", logits.len(), mb.b, mb.s);
        }
        let mut labels = vec![0; mb.b * mb.s];
        mb.rows.iter().zip(&mb.labels).for_each(|(&p, &l)| labels[p] = l);
        return Ok(slice_stats(&logits, v_local, r * v_local, opts.vocab_size, &mb.rows, &labels));
    }
    let logits = rank.host_logits_rows(&mb.tokens, mb.b, mb.s, &mb.rows)?;
    let v_local = logits.len() / n.max(1);
    if n > 0 && (v_local == 0 || logits.len() != n * v_local) {
        bail!("rank {r} returned {} logits for {n} rows", logits.len());
    }
    let rows: Vec<usize> = (0..n).collect();
    Ok(slice_stats(&logits, v_local, r * v_local, opts.vocab_size, &rows, &mb.labels))
}

/// Receives each batch's scores: `(batch index, batch, one score per row)`.
pub type OnBatch<'a> = dyn FnMut(usize, &RowBatch, Vec<TokenScore>) -> Result<()> + 'a;

/// Runs batches `make(0..count)` through `ranks` (rank order = vocab slice order) and calls
/// `on_batch(k, batch, scores)` in batch order with one [`TokenScore`] per scored row.
pub fn score_batches(
    ranks: Vec<Box<dyn LogitsRank + '_>>,
    count: usize,
    make: &(dyn Fn(usize) -> RowBatch + Sync),
    opts: RowOptions,
    on_batch: &mut OnBatch,
) -> Result<()> {
    if ranks.is_empty() {
        bail!("evaluation needs at least one model rank");
    }
    std::thread::scope(|scope| -> Result<()> {
        let mut receivers = Vec::with_capacity(ranks.len());
        for (r, mut rank) in ranks.into_iter().enumerate() {
            let (tx, rx) = mpsc::sync_channel::<Result<SliceStats>>(1);
            receivers.push(rx);
            scope.spawn(move || {
                for k in 0..count {
                    let stats = rank_stats(rank.as_mut(), r, &make(k), opts);
                    let failed = stats.is_err();
                    if tx.send(stats).is_err() || failed {
                        return; // the collector stopped (another rank failed) or this one did
                    }
                }
            });
        }
        for k in 0..count {
            let mut slices = Vec::with_capacity(receivers.len());
            for (r, rx) in receivers.iter().enumerate() {
                let s = rx.recv().context("a model rank stopped early")?;
                slices.push(s.with_context(|| format!("micro batch {k}, tensor-parallel rank {r}"))?);
            }
            on_batch(k, &make(k), combine(&slices))?;
        }
        Ok(())
    })
}
