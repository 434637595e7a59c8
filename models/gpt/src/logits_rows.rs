//! Logits at chosen positions only ([`megatron_core::Model::logits_rows`]): the whole-model
//! forward as [`megatron_core::Model::logits`], then the output layer on the decoder output
//! rows that are scored. Evaluation scores one to a few positions per sample (LAMBADA's target
//! word), so this skips most of the output-layer GEMM (`C × V/tp` per position: a fifth of a
//! SmolLM2-135M forward) and the `(B, T, V/tp)` logits copy.
//!
//! Each logits row is the same dot products as in the full path; the GEMM may block a
//! different number of rows differently, so values agree to rounding (tested in
//! `tests/logits_rows.rs`), not necessarily bit for bit.

use crate::model::GptModel;
use anyhow::{bail, Result};
use megatron_core::{DType, DeviceTensor, HostBuffer};
use megatron_transformer::linear_forward;
use megatron_transformer::step::copy_any;
use megatron_transformer::tp_mappings::copy_to_tp_region_forward;
use megatron_transformer::StepInfo;

impl GptModel {
    /// Logits `(rows.len(), V_padded/tp)` (f32) at the flat positions `rows` of `tokens (b, s)`;
    /// `None` where the full path is needed (sequence parallelism shards the decoder output by
    /// tokens, context parallelism is not evaluated here).
    pub(crate) fn logits_at_rows(
        &mut self,
        tokens: &[i32],
        b: usize,
        s: usize,
        rows: &[usize],
    ) -> Result<Option<DeviceTensor>> {
        if self.sequence_parallel() || self.ctx.grid.cp > 1 || self.embedding.is_none() || !self.ctx.is_last_stage() {
            return Ok(None);
        }
        if tokens.len() != b * s {
            bail!("{} tokens given for a {b}x{s} batch", tokens.len());
        }
        if let Some(&bad) = rows.iter().find(|&&r| r >= b * s) {
            bail!("logits row {bad} is outside the {b}x{s} batch");
        }
        let step = StepInfo { batch: b, seq: s, train: false, seed: 0 };
        let ids = self.upload_ids(tokens, "token", self.vocab_padded, None)?;
        self.discard_in_flight();
        self.run_forward(Some(&ids), None, &step)?;
        let bk = self.backend.clone();
        let bk = bk.as_ref();

        // Gather the scored rows of the decoder output `(B, T, C)` into `(1, n, C)` with the
        // embedding lookup (a row gather of an f32 table), in the output's own dtype.
        let x = self.decoder.output();
        let c = x.shape().last().copied().unwrap_or(0);
        let n = rows.len();
        let x32;
        let table = if x.dtype() == DType::F32 {
            x
        } else {
            let mut t = bk.zeros(x.shape(), DType::F32)?;
            copy_any(bk, x, &mut t)?;
            x32 = t;
            &x32
        };
        let idx = bk.from_host(HostBuffer::I32(rows.iter().map(|&r| r as i32).collect()), &[n])?;
        let mut picked32 = bk.zeros(&[1, n, c], DType::F32)?;
        bk.embedding_forward(&idx, table, 0, &mut picked32, false)?;
        let picked = if x.dtype() == DType::F32 {
            picked32
        } else {
            let mut t = bk.zeros(&[1, n, c], x.dtype())?;
            copy_any(bk, &picked32, &mut t)?;
            t
        };

        // The output layer as in `run_logits` (column-parallel, padding mask in the bias slot,
        // logits in the parameter dtype), on those rows only.
        let head: Vec<_> = self.output_layer.iter_mut().chain(self.shared_embedding.iter_mut()).collect();
        if !head.is_empty() {
            self.decoder.run_pre_hook(head)?;
        }
        let w = match (&self.output_layer, &self.shared_embedding, &self.embedding) {
            (Some(p), _, _) | (None, Some(p), _) => &p.value,
            (None, None, Some(e)) => &e.word_embeddings.weight.value,
            (None, None, None) => bail!("pipeline stage {} has no output layer", self.ctx.pp_rank),
        };
        let vocab_local = self.vocab_padded / self.ctx.tp_size();
        copy_to_tp_region_forward(&self.ctx, &picked)?;
        let mut logits = bk.zeros(&[1, n, vocab_local], self.config.params_dtype)?;
        linear_forward(bk, &picked, w, self.vocab_mask.as_ref(), &mut logits)?;
        if logits.dtype() == DType::F32 {
            return Ok(Some(logits));
        }
        let mut out = bk.zeros(&[1, n, vocab_local], DType::F32)?;
        copy_any(bk, &logits, &mut out)?;
        Ok(Some(out))
    }
}
