//! `megatron-transformer`: the transformer building blocks of Megatron-Core, with explicit
//! forward and backward and tensor-parallel collectives where Megatron places them (SPEC §5.2):
//! column/row-parallel linears, the vocab-parallel embedding and cross entropy, LayerNorm and
//! RMSNorm, self-attention, the MLP, the pre-norm transformer layer and the block.
//!
//! Models are assembled from specs and providers ([`spec`]) like Megatron-Core's
//! `ModuleSpec`/`BackendSpecProvider`. All arithmetic goes through [`megatron_core::Backend`]
//! ops; this crate only orchestrates them. Activations are `(B, T, C)` row-major (Megatron uses
//! `[s, b, h]`; the per-token math is the same, only the row order of the flattened tokens
//! differs). Parameter names are Megatron-Core's local-spec state-dict keys (SPEC §4.14).

pub mod attention;
pub mod block;
pub mod context_parallel;
pub mod cross_entropy;
pub mod embedding;
pub mod grad_check;
pub mod init;
pub mod layer;
pub mod linear;
pub mod mlp;
pub mod mlp_half;
pub mod mlp_slot;
pub mod norm;
pub mod precision;
pub mod qk_norm;
pub mod recompute;
pub mod sequence_parallel;
pub mod spec;
pub mod step;
pub mod tp_mappings;
// Which global layers each pipeline stage owns (even or Megatron's uneven split): GPT, BERT.
pub mod pipeline_split;

pub use attention::{LayerKvCache, SelfAttention};
pub use block::TransformerBlock;
pub use cross_entropy::VocabParallelCrossEntropy;
pub use embedding::{LanguageModelEmbedding, VocabParallelEmbedding};
pub use init::{Init, ModuleBuilder, Split};
pub use layer::TransformerLayer;
pub use linear::{linear_backward, linear_forward, ColumnParallelLinear, LinearConfig, LinearLayer, RowParallelLinear};
pub use mlp::Mlp;
pub use mlp_slot::{MlpSlot, WithMlpProvider};
pub use norm::{LayerNorm, NormKind, NormLayer, RmsNorm};
pub use precision::Precision;
pub use recompute::{FullRecompute, RecomputeMethod};
pub use sequence_parallel::{SequenceParallelColumnLinear, SequenceParallelRowLinear};
pub use spec::{
    gpt_decoder_block_spec, gpt_layer_local_spec, Activation, LocalSpecProvider, MlpSpec, RotaryConfig,
    SelfAttentionSpec, SpecProvider, TransformerBlockSpec, TransformerConfig, TransformerLayerSpec,
};
pub use step::{BackwardScratch, DropoutSite, ModuleScratch, SavedActivations, StepInfo};
