//! Embeddings (SPEC §4.4, §5.2): the vocab-parallel word embedding and Megatron-Core's
//! `LanguageModelEmbedding` (word + learned absolute positions + embedding dropout).

use crate::context_parallel::global_position;
use crate::init::{Init, ModuleBuilder, Split};
use crate::layer::{hidden_dropout, hidden_dropout_in};
use crate::sequence_parallel::{gather_from_sp_region, reduce_scatter_to_sp_region};
use crate::step::{empty, ensure_buffer, DropoutSite, StepInfo};
use crate::tp_mappings::all_reduce_tp;
use anyhow::{bail, Result};
use megatron_core::{Backend, DType, DeviceTensor, HostBuffer, ParallelContext, Param, ReduceOp};
use std::sync::Arc;

/// `[V_padded, h]` table with rows split over TP: rank `r` owns ids `[r*V/tp, (r+1)*V/tp)`;
/// ids outside the range give zero rows and the partial lookups are all-reduced.
pub struct VocabParallelEmbedding {
    backend: Arc<dyn Backend>,
    ctx: ParallelContext,
    pub weight: Param,
}

impl VocabParallelEmbedding {
    /// Parameter `{prefix}.weight`, `Normal(0, init_std)`.
    pub fn new(b: &ModuleBuilder, prefix: &str, vocab_padded: usize, hidden: usize, init_std: f32) -> Result<Self> {
        let weight = b.param(
            &format!("{prefix}.weight"),
            &[vocab_padded, hidden],
            Split::Rows { chunks: 1 },
            Init::Normal(init_std),
        )?;
        Ok(VocabParallelEmbedding { backend: b.backend.clone(), ctx: b.ctx.clone(), weight })
    }

    /// `(first id, number of ids)` owned by this rank.
    pub fn vocab_range(&self) -> (usize, usize) {
        let rows = self.weight.value.shape()[0];
        (self.weight.layout.tp_rank * rows, rows)
    }

    /// `out (B, T, C) = table[ids]`, `ids` int32 `(B*T)`.
    pub fn forward(&mut self, ids: &DeviceTensor, out: &mut DeviceTensor) -> Result<()> {
        self.backend.embedding_forward(ids, &self.weight.value, self.vocab_range().0, out, false)?;
        all_reduce_tp(&self.ctx, out, ReduceOp::Sum, "the vocab-parallel embedding lookup")
    }

    /// `d_table[id] += d_out[i]` for the ids this rank owns (the all-reduce's backward is the
    /// identity: `d_out` is replicated).
    pub fn backward(&mut self, ids: &DeviceTensor, d_out: &DeviceTensor) -> Result<()> {
        self.backend.embedding_backward(ids, d_out, self.vocab_range().0, &mut self.weight.grad)
    }
}

/// Word embedding + learned absolute position embedding (absent with rotary positions), then
/// embedding dropout (`hidden_dropout`). Megatron transposes to `[s, b, h]` here; we stay
/// `(B, T, C)`.
///
/// With sequence parallelism the output is this rank's `(N/tp, C)` token shard (see
/// [`crate::sequence_parallel`]): the partial vocab lookups, with the positions added on TP
/// rank 0 only, are reduce-scattered (one collective instead of Megatron's all-reduce + split
/// when there are positions; the sum is the same and exact, each token's row being non-zero on
/// one rank only), and the dropout runs on the shard in the TP rank's stream.
pub struct LanguageModelEmbedding {
    backend: Arc<dyn Backend>,
    ctx: ParallelContext,
    sequence_parallel: bool,
    pub word_embeddings: VocabParallelEmbedding,
    /// `None` when positions come from elsewhere (rotary embeddings in the attention).
    pub position_embeddings: Option<Param>,
    dropout: f32,
    position_ids: DeviceTensor, // (B*T) int32: t for every row
    d_embedding: DeviceTensor,  // (B, T, C): dropout-masked output gradient
}

impl LanguageModelEmbedding {
    /// Parameters `{prefix}.word_embeddings.weight` `[V_padded, h]` and
    /// `{prefix}.position_embeddings.weight` `[max_positions, h]` (replicated).
    pub fn new(
        b: &ModuleBuilder,
        prefix: &str,
        vocab_padded: usize,
        max_positions: usize,
        hidden: usize,
        init_std: f32,
        dropout: f32,
    ) -> Result<Self> {
        let mut e = Self::without_positions(b, prefix, vocab_padded, hidden, init_std, dropout)?;
        e.position_embeddings = Some(b.param(
            &format!("{prefix}.position_embeddings.weight"),
            &[max_positions, hidden],
            Split::Replicated,
            Init::Normal(init_std),
        )?);
        Ok(e)
    }

    /// Only `{prefix}.word_embeddings.weight` (`--position-embedding-type rope`/`none`).
    pub fn without_positions(
        b: &ModuleBuilder,
        prefix: &str,
        vocab_padded: usize,
        hidden: usize,
        init_std: f32,
        dropout: f32,
    ) -> Result<Self> {
        let word_embeddings =
            VocabParallelEmbedding::new(b, &format!("{prefix}.word_embeddings"), vocab_padded, hidden, init_std)?;
        let position_embeddings = None;
        let backend = b.backend.clone();
        Ok(LanguageModelEmbedding {
            ctx: b.ctx.clone(),
            sequence_parallel: b.sequence_parallel,
            position_ids: backend.zeros(&[0], DType::I32)?,
            d_embedding: empty(backend.as_ref())?,
            backend,
            word_embeddings,
            position_embeddings,
            dropout,
        })
    }

    fn ensure_positions(&mut self, step: &StepInfo) -> Result<()> {
        let Some(pos) = &self.position_embeddings else { return Ok(()) };
        let max = pos.value.shape()[0];
        // With context parallelism `step.seq` is this rank's T/cp tokens, which sit at the
        // global positions of its two chunks (see `crate::context_parallel`).
        let (cp, cp_rank) = (self.ctx.grid.cp, self.ctx.cp_rank);
        if step.seq * cp > max {
            bail!(
                "sequence length {} exceeds max_position_embeddings {max}; raise --max-position-embeddings",
                step.seq * cp
            );
        }
        if self.position_ids.shape() != [step.tokens()] {
            let position = |t: usize| if cp > 1 { global_position(t, step.seq, cp, cp_rank) } else { t };
            let ids: Vec<i32> = (0..step.tokens()).map(|i| position(i % step.seq) as i32).collect();
            self.position_ids = self.backend.from_host(HostBuffer::I32(ids), &[step.tokens()])?;
        }
        Ok(())
    }

    /// `out (B, T, C) = dropout(word[ids] + pos[t])`, `ids` int32 `(B*T)`.
    pub fn forward(&mut self, ids: &DeviceTensor, out: &mut DeviceTensor, step: &StepInfo) -> Result<()> {
        self.ensure_positions(step)?;
        if self.sequence_parallel {
            return self.forward_sequence_parallel(ids, out, step);
        }
        // Positions are added after the vocab all-reduce so they are counted once.
        self.word_embeddings.forward(ids, out)?;
        if let Some(pos) = &self.position_embeddings {
            self.backend.embedding_forward(&self.position_ids, &pos.value, 0, out, true)?;
        }
        hidden_dropout(self.backend.as_ref(), out, self.dropout, 0, DropoutSite::Embedding, step)
    }

    /// Accumulates the word and position table gradients from `d_out (B, T, C)`.
    pub fn backward(&mut self, ids: &DeviceTensor, d_out: &DeviceTensor, step: &StepInfo) -> Result<()> {
        self.ensure_positions(step)?;
        ensure_buffer(self.backend.as_ref(), &mut self.d_embedding, d_out.shape(), d_out.dtype())?;
        self.backend.copy(d_out, &mut self.d_embedding)?;
        if self.sequence_parallel {
            return self.backward_sequence_parallel(ids, step);
        }
        hidden_dropout(self.backend.as_ref(), &mut self.d_embedding, self.dropout, 0, DropoutSite::Embedding, step)?;
        if let Some(pos) = self.position_embeddings.as_mut() {
            self.backend.embedding_backward(&self.position_ids, &self.d_embedding, 0, &mut pos.grad)?;
        }
        self.word_embeddings.backward(ids, &self.d_embedding)
    }

    /// `out (N/tp, C)` = this rank's token shard of `dropout(word[ids] + pos[t])`.
    fn forward_sequence_parallel(&mut self, ids: &DeviceTensor, out: &mut DeviceTensor, step: &StepInfo) -> Result<()> {
        let bk = self.backend.as_ref();
        let table = &self.word_embeddings.weight.value;
        // (N, C) partials in the output's dtype (the half residual stream, or fp32 with
        // --fp32-residual-connection), as the non-SP lookup writes into that output directly.
        let mut full = bk.zeros(&[step.tokens(), table.shape()[1]], out.dtype())?; // (N, C) partial
        bk.embedding_forward(ids, table, self.word_embeddings.vocab_range().0, &mut full, false)?;
        if let (Some(pos), 0) = (&self.position_embeddings, self.ctx.tp_rank) {
            bk.embedding_forward(&self.position_ids, &pos.value, 0, &mut full, true)?;
        }
        reduce_scatter_to_sp_region(&self.ctx, &full, out)?;
        let sp = Some(self.ctx.tp_rank);
        hidden_dropout_in(bk, out, self.dropout, 0, DropoutSite::Embedding, step, sp)
    }

    /// Backward of [`Self::forward_sequence_parallel`] from `self.d_embedding (N/tp, C)`: the
    /// reduce-scatter's backward all-gathers the (dropout-masked) gradient, then both tables
    /// take their gradient from the whole `(N, C)` (so the position gradient is complete and
    /// equal on every TP rank).
    fn backward_sequence_parallel(&mut self, ids: &DeviceTensor, step: &StepInfo) -> Result<()> {
        let bk = self.backend.clone();
        let sp = Some(self.ctx.tp_rank);
        hidden_dropout_in(bk.as_ref(), &mut self.d_embedding, self.dropout, 0, DropoutSite::Embedding, step, sp)?;
        let cols = self.word_embeddings.weight.value.shape()[1];
        let mut full = bk.zeros(&[step.tokens(), cols], self.d_embedding.dtype())?; // (N, C)
        gather_from_sp_region(&self.ctx, &self.d_embedding, &mut full)?;
        if let Some(pos) = self.position_embeddings.as_mut() {
            bk.embedding_backward(&self.position_ids, &full, 0, &mut pos.grad)?;
        }
        self.word_embeddings.backward(ids, &full)
    }

    pub fn params(&self) -> Vec<&Param> {
        let mut v = vec![&self.word_embeddings.weight];
        v.extend(self.position_embeddings.as_ref());
        v
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut v = vec![&mut self.word_embeddings.weight];
        v.extend(self.position_embeddings.as_mut());
        v
    }
}
