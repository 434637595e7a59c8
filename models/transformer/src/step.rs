//! Per-microbatch run information shared by every module ([`StepInfo`]), dropout seed
//! derivation, the activation-buffer helper that allocates once per `(B, T)` shape, and
//! [`SavedActivations`], the saved-for-backward tensors of one forward moved out of the modules
//! (pipeline stages keep several microbatches in flight).

use crate::init::mix64;
use anyhow::{bail, Result};
use megatron_core::{Backend, DType, DeviceTensor};

/// Where a dropout mask is applied; part of the seed so no two sites share a mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropoutSite {
    Embedding,
    AttentionProbs,
    AttentionOutput,
    MlpOutput,
}

impl DropoutSite {
    fn code(self) -> u64 {
        match self {
            DropoutSite::Embedding => 1,
            DropoutSite::AttentionProbs => 2,
            DropoutSite::AttentionOutput => 3,
            DropoutSite::MlpOutput => 4,
        }
    }
}

/// What every module needs to know about the microbatch being run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepInfo {
    pub batch: usize,
    pub seq: usize,
    /// Dropout on (and activations kept for backward).
    pub train: bool,
    /// `Batch::seed`: the root of every dropout mask of this microbatch.
    pub seed: u64,
}

impl StepInfo {
    /// Rows of the flattened `(B, T)` activations.
    pub fn tokens(&self) -> usize {
        self.batch * self.seq
    }

    /// Seed of the dropout mask at `site` of layer `layer` (the embedding uses layer 0).
    /// `tp_rank` is mixed in only where Megatron uses the model-parallel RNG stream (attention
    /// probabilities, whose heads differ per TP rank, SPEC §5.11); other masks are identical on
    /// every TP rank because they act on replicated activations.
    pub fn dropout_seed(&self, layer: usize, site: DropoutSite, tp_rank: usize) -> u64 {
        let tp = if site == DropoutSite::AttentionProbs { tp_rank as u64 + 1 } else { 0 };
        mix64(mix64(mix64(self.seed) ^ (layer as u64 + 1)) ^ (site.code() << 32) ^ (tp << 48))
    }

    /// Seed of a dropout mask on sequence-parallel activations (SPEC §5.11: with SP the
    /// embedding dropout and the whole block run in the model-parallel RNG stream): the TP rank
    /// is mixed in at every site, since each rank holds different tokens. `None` is the
    /// replicated case, [`Self::dropout_seed`].
    pub fn dropout_seed_in(&self, layer: usize, site: DropoutSite, tp_rank: usize, sequence_parallel: bool) -> u64 {
        if !sequence_parallel {
            return self.dropout_seed(layer, site, tp_rank);
        }
        mix64(self.dropout_seed(layer, site, tp_rank) ^ ((tp_rank as u64 + 1) << 40))
    }

    /// The dropout probability to apply now: zero outside training.
    pub fn dropout_p(&self, p: f32) -> f32 {
        if self.train {
            p
        } else {
            0.0
        }
    }
}

/// Reallocates `t` (zeros, f32) unless it already has `shape`; activation buffers are kept
/// across microbatches of the same `(B, T)`.
pub fn ensure_shape(backend: &dyn Backend, t: &mut DeviceTensor, shape: &[usize]) -> Result<()> {
    if t.shape() != shape || t.dtype() != DType::F32 {
        *t = backend.zeros(shape, DType::F32)?;
    }
    Ok(())
}

/// Reallocates `t` (zeros of `dtype`) unless it already has `shape` and `dtype`: the
/// activation and gradient buffers of a half-precision model.
pub fn ensure_buffer(backend: &dyn Backend, t: &mut DeviceTensor, shape: &[usize], dtype: DType) -> Result<()> {
    if t.shape() != shape || t.dtype() != dtype {
        *t = backend.zeros(shape, dtype)?;
    }
    Ok(())
}

/// Re-exported for the models built from these blocks (defined beside `copy`/`cast` in core,
/// where the optimizers and the data-parallel reducer use it too).
pub use megatron_core::copy_any;

/// Sets the gradient of every parameter in `params` to zero: the `Model::zero_grad` of every
/// model built from these blocks (one implementation for all of them).
pub fn zero_grads(backend: &dyn Backend, params: Vec<&mut megatron_core::Param>) -> Result<()> {
    params.into_iter().try_for_each(|p| backend.fill(&mut p.grad, 0.0))
}

/// An empty placeholder until the first forward fixes the shape.
pub fn empty(backend: &dyn Backend) -> Result<DeviceTensor> {
    backend.zeros(&[0], DType::F32)
}

/// The saved-for-backward tensors of one training forward, moved out of the modules that hold
/// them (each module lists its own through a `saved_activations_mut` method, in a fixed order).
/// Moving is a handle swap: no copy, no allocation. A forward run while a microbatch's tensors
/// are out of the modules refills them through [`ensure_shape`] (fresh buffers when the
/// modules hold [`SavedActivations::placeholders`], reused ones when they hold a spare set).
pub struct SavedActivations {
    tensors: Vec<DeviceTensor>,
}

impl SavedActivations {
    /// `n` zero-size tensors: swapped into the modules they leave nothing to reuse, so the next
    /// forward allocates.
    pub fn placeholders(backend: &dyn Backend, n: usize) -> Result<SavedActivations> {
        Ok(SavedActivations { tensors: (0..n).map(|_| empty(backend)).collect::<Result<_>>()? })
    }

    /// Exchanges these tensors with the module slots `slots` (same order as they were taken).
    pub fn swap_with(&mut self, slots: Vec<&mut DeviceTensor>) -> Result<()> {
        if slots.len() != self.tensors.len() {
            bail!(
                "an activation stash of {} tensors cannot be swapped with {} module buffers (stashed from a \
                 different model?)",
                self.tensors.len(),
                slots.len()
            );
        }
        for (slot, t) in slots.into_iter().zip(&mut self.tensors) {
            std::mem::swap(slot, t);
        }
        Ok(())
    }

    /// Bytes held (for memory accounting and tests).
    /// How many tensors the set holds.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.tensors.iter().map(|t| t.numel() * t.dtype().size()).sum()
    }
}

/// Gradient buffers of the backward pass, shared by all layers of a block (only one layer
/// runs backward at a time), so their memory does not grow with depth. Each user sizes the
/// buffers it takes with [`ensure_shape`].
pub struct BackwardScratch {
    pub d_branch: DeviceTensor, // (B, T, C): gradient entering a residual branch
    pub d_norm: DeviceTensor,   // (B, T, C): gradient at a norm's input or output
    pub inner: ModuleScratch,
}

/// The gradient buffers inside attention and MLP.
pub struct ModuleScratch {
    pub d_context: DeviceTensor,   // (B, T, heads/tp * head_dim)
    pub d_qkv: DeviceTensor,       // (B, T, heads/tp, 3, head_dim); (B, T, ng/tp, r+2, head_dim) with GQA
    pub d_qkv_heads: DeviceTensor, // GQA only: (B, T, heads/tp, 3, head_dim)
    pub d_act: DeviceTensor,       // (B, T, F/tp)
    pub d_fc1: DeviceTensor,       // (B, T, F/tp), (B, T, 2F/tp) when gated
}

impl BackwardScratch {
    pub fn new(backend: &dyn Backend) -> Result<BackwardScratch> {
        Ok(BackwardScratch {
            d_branch: empty(backend)?,
            d_norm: empty(backend)?,
            inner: ModuleScratch {
                d_context: empty(backend)?,
                d_qkv: empty(backend)?,
                d_qkv_heads: empty(backend)?,
                d_act: empty(backend)?,
                d_fc1: empty(backend)?,
            },
        })
    }
}
