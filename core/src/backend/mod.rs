//! The [`Backend`] trait: allocation, host transfer and the coarse, layer-level op list that
//! every compute backend (CPU, CUDA) implements and the parity suite checks.
//!
//! The ops are grouped into family traits, one file each ([`MemoryOps`] is the base: the others'
//! default methods use its `name` and host transfers); [`Backend`] is all of them.
//!
//! Conventions for every op:
//! * tensors are row-major; "rows" `N` are the flattened leading dims (e.g. `B*T`), "C" the
//!   last dim;
//! * outputs named `out`/`d_x` are **overwritten**; parameter gradients (`d_weight`,
//!   `d_bias`, `d_table`) are **accumulated** (`+=`), so microbatches add up;
//! * an op given a dtype it does not implement fails with an error naming the op, the dtype
//!   and the backend (never a silent cast).
//!
//! # Dtype rules (mixed precision, SPEC §6.7)
//!
//! Every floating-point tensor argument of every op may be fp32, bf16 or fp16, **each argument
//! independently** (e.g. a bf16 activation with an fp32 weight, or an fp32 gradient
//! accumulated from bf16 operands). Integer arguments (`ids`, `targets`, `key_start`) stay int32.
//! * **Inputs are widened** to f32 at the op boundary (exact for bf16/fp16).
//! * **Arithmetic and every accumulation is f32** (GEMM dot products, row sums, norms' mean and
//!   variance, softmax max/sum, attention scores/probabilities/`lse`, cross-entropy sums,
//!   gradient partial sums); `sum_squares` accumulates in f64.
//! * **Outputs are rounded once**, round-to-nearest-even, to the dtype of the output tensor the
//!   caller passed (normally the input dtype: bf16 in → bf16 out). Accumulated outputs
//!   (`d_weight`, `d_bias`, `d_table`, gemm with `beta != 0`, `embedding_forward` with
//!   `accumulate`) read the old value widened, add in f32 and round once: pass fp32 buffers to
//!   accumulate gradients in fp32 (`--accumulate-allreduce-grads-in-fp32` semantics).
//! * **Statistics are always fp32** and an op rejects other dtypes for them: `mean`/`rstd` of the
//!   norms, `lse` of attention, `row_max`/`sum_exp`/`target_logit`/`d_loss` of the cross-entropy
//!   pieces. The loss the trainer assembles from them is therefore f32.
//! * Scalars (`alpha`, `beta`, `eps`, `lr`, scale factors, ...) are f32.
//! * In-place ops (`scale`, `fill`, `axpy`'s `a`, `dropout`, `rotary`, `adam_step`/`sgd_step`
//!   state, `cross_entropy_backward_inplace`'s `logits`) compute in f32 and round back to the
//!   tensor's own dtype. Optimizers are normally given fp32 main params, grads and state;
//!   half params work but round every step.
//! * `gemm`: when `a` and `b` are both bf16 a backend may use native bf16 dot-product
//!   instructions (CPU: AVX512-BF16 `vdpbf16ps`) as long as products are exact and sums are f32;
//!   results then differ from the widened-f32 path only in summation order, never by more than
//!   the f32 accumulation tolerance. The K (reduction) dimension is never split across threads,
//!   so results do not depend on the thread count.
//! * `attention_forward`/`attention_backward` with bf16 `qkv`/`out`/`d_out`/`d_qkv`: a backend
//!   may run the tile products on native bf16 dot-product instructions (CPU: `vdpbf16ps`)
//!   with f32 sums, as FlashAttention does on GPUs: the scores, the softmax statistics (`max`,
//!   `Σ`, `lse`, `D_i`) and the probabilities are f32, and the probability tile `P` and the
//!   score gradient `dS` are rounded to bf16 once before the products that consume them
//!   (`P·V`, `Pᵀ·dO`, `dS·K`, `dSᵀ·Q`). Results stay independent of the thread count.
//! * `abs_max` reports inf/NaN of the tensor's own values (an fp16 overflow shows as inf).
//! * `copy` needs equal dtypes; `cast` converts between any float dtypes.

mod activation;
mod attention;
mod elementwise;
mod embedding_loss;
mod gemm;
mod kv_cache;
mod mamba;
mod memory;
mod norm;
mod optimizer;
mod padded_attention;
mod ring_attention;
mod rotary;

pub use activation::ActivationOps;
pub use attention::AttentionOps;
pub use attention::AttentionSpec;
pub use elementwise::ElementwiseOps;
pub use embedding_loss::EmbeddingLossOps;
pub use gemm::GemmOps;
pub use gemm::GemmSpec;
pub use kv_cache::KvCacheAttentionSpec;
pub use kv_cache::KvCacheOps;
pub use mamba::MambaOps;
pub use memory::{copy_any, MemoryOps};
pub use norm::NormOps;
pub use optimizer::AdamStep;
pub use optimizer::OptimizerOps;
pub use padded_attention::PaddedAttentionOps;
pub use ring_attention::RingAttentionOps;
pub use rotary::RotaryOps;
pub use rotary::RotarySpec;

/// A compute backend. CPU and CUDA implement the same list; names are registered plugins.
///
/// The ops are grouped into family traits, one file each; `Backend` is all of them plus
/// `Send + Sync`, and every type that implements all families is a `Backend` (blanket impl).
/// Calls through `&dyn Backend` or a `B: Backend` bound need no other import; calling an op on
/// a concrete backend type (`CpuBackend`) needs its family trait in scope.
pub trait Backend:
    Send
    + Sync
    + MemoryOps
    + ElementwiseOps
    + GemmOps
    + NormOps
    + ActivationOps
    + AttentionOps
    + RotaryOps
    + KvCacheOps
    + EmbeddingLossOps
    + OptimizerOps
    + PaddedAttentionOps
    + MambaOps
    + RingAttentionOps
{
}

impl<T> Backend for T where
    T: Send
        + Sync
        + MemoryOps
        + ElementwiseOps
        + GemmOps
        + NormOps
        + ActivationOps
        + AttentionOps
        + RotaryOps
        + KvCacheOps
        + EmbeddingLossOps
        + OptimizerOps
        + PaddedAttentionOps
        + MambaOps
        + RingAttentionOps
{
}
