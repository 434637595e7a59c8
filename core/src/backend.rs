//! The [`Backend`] trait: allocation, host transfer and the coarse, layer-level op list that
//! every compute backend (CPU, CUDA) implements and the parity suite checks.
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

use crate::cross_attention::CrossAttentionSpec;
use crate::gqa::GqaSpec;
use crate::{DType, DeviceTensor, HostBuffer, Result};

/// `C[m,n] = alpha * op(A)[m,k] · op(B)[k,n] + beta * C (+ bias[n] on every row)`.
///
/// `A` is stored row-major as `[m,k]`, or `[k,m]` when `trans_a`; `B` as `[k,n]`, or `[n,k]`
/// when `trans_b` (the layout of a Linear weight `[out, in]`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmSpec {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    pub alpha: f32,
    pub beta: f32,
}

impl GemmSpec {
    /// `out[m,n] = x[m,k] · W[n,k]^T`, the forward of a Linear layer.
    pub fn linear(m: usize, n: usize, k: usize) -> GemmSpec {
        GemmSpec { m, n, k, trans_a: false, trans_b: true, alpha: 1.0, beta: 0.0 }
    }
}

/// Causal (or full) multi-head self-attention over a fused QKV tensor.
///
/// `qkv` is `(B, T, heads, 3, head_dim)`: Megatron's fused layout, per head its q, k and v
/// rows (SPEC §4.2 with `ng = np`). `out` is `(B, T, heads*head_dim)`, `lse` (the
/// log-sum-exp of every score row, kept for the recomputing backward) is `(B, heads, T)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionSpec {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub causal: bool,
    /// Multiplies `q·k` before the softmax; Megatron's default is `1/sqrt(head_dim)`.
    pub scale: f32,
    /// Dropout on the attention probabilities (0 = off). The mask is a pure function of
    /// `(dropout_seed, b, h, i, j)` so backward regenerates it instead of storing it.
    pub dropout_p: f32,
    pub dropout_seed: u64,
}

/// Rotary position embedding applied to the q and k parts of a fused `(B,T,heads,3,hd)` QKV.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RotarySpec {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Rotated channels (`head_dim * rotary_percent`), even.
    pub rotary_dim: usize,
    pub base: f32,
    /// Adjacent pairs `(2i, 2i+1)` instead of the two halves.
    pub interleaved: bool,
    /// Position of token 0 (for generation with a cache).
    pub position_offset: usize,
}

/// Attention of new queries against a per-layer key/value cache (incremental decoding).
///
/// `qkv` is the fused `(B, Tq, heads, 3, head_dim)` of the `Tq` new tokens of every row; their
/// k and v are first written into the caches `(B, capacity, heads, head_dim)` at positions
/// `[offset, offset + Tq)`. New query `i` (absolute position `p = offset + i`) then attends to
/// the cached keys `j` with `key_start[b] <= j <= p` (causal; `key_start` masks left padding,
/// all zeros when absent); a query with no key gets a zero output. `out` is
/// `(B, Tq, heads*head_dim)`. Nothing is saved: inference only.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvCacheAttentionSpec {
    pub batch: usize,
    /// New tokens per row in this call: the prompt prefix when prefilling, 1 when decoding.
    pub new_tokens: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Length of the caches' sequence dim.
    pub capacity: usize,
    /// Cache position of the first new token (the number of tokens already cached).
    pub offset: usize,
    /// Multiplies `q·k` before the softmax (`1/sqrt(head_dim)`).
    pub scale: f32,
}

/// One fused AdamW update (decoupled weight decay, bias correction), Megatron/PyTorch
/// semantics: `p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g²;
/// p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamStep {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// 1-based step count for bias correction.
    pub step: u64,
}

/// A compute backend. CPU and CUDA implement the same list; names are registered plugins.
pub trait Backend: Send + Sync {
    /// Registered name (`cpu`, `cuda`).
    fn name(&self) -> &str;

    // ---- memory -------------------------------------------------------------------------
    fn zeros(&self, shape: &[usize], dtype: DType) -> Result<DeviceTensor>;
    #[allow(clippy::wrong_self_convention)] // the name ARCHITECTURE.md gives the op
    fn from_host(&self, data: HostBuffer, shape: &[usize]) -> Result<DeviceTensor>;
    fn to_host(&self, t: &DeviceTensor) -> Result<HostBuffer>;
    fn synchronize(&self) -> Result<()>;
    /// `dst = src` (same shape and dtype).
    fn copy(&self, src: &DeviceTensor, dst: &mut DeviceTensor) -> Result<()>;
    /// `dst = cast(src)` between float dtypes (round to nearest even).
    fn cast(&self, src: &DeviceTensor, dst: &mut DeviceTensor) -> Result<()>;

    // ---- elementwise and reductions ------------------------------------------------------
    fn fill(&self, t: &mut DeviceTensor, value: f32) -> Result<()>;
    fn scale(&self, t: &mut DeviceTensor, s: f32) -> Result<()>;
    /// `a += alpha * b`.
    fn axpy(&self, a: &mut DeviceTensor, alpha: f32, b: &DeviceTensor) -> Result<()>;
    /// `out = a + b` (the residual add).
    fn add(&self, a: &DeviceTensor, b: &DeviceTensor, out: &mut DeviceTensor) -> Result<()>;
    /// `out[C] += sum over rows of x[N, C]` (bias gradients).
    fn sum_rows(&self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()>;
    /// `Σ x²` accumulated in f64 (gradient norms).
    fn sum_squares(&self, x: &DeviceTensor) -> Result<f64>;
    /// `max |x|` and whether any element is inf/NaN.
    fn abs_max(&self, x: &DeviceTensor) -> Result<(f32, bool)>;

    // ---- matmul ---------------------------------------------------------------------------
    /// See [`GemmSpec`]. `bias` (length n) is added to every output row when given.
    fn gemm(
        &self,
        a: &DeviceTensor,
        b: &DeviceTensor,
        c: &mut DeviceTensor,
        spec: GemmSpec,
        bias: Option<&DeviceTensor>,
    ) -> Result<()>;

    // ---- norms ----------------------------------------------------------------------------
    /// `out = (x - mean)/sqrt(var + eps) * w + b` over the last dim; saves `mean`, `rstd` `[N]`.
    #[allow(clippy::too_many_arguments)]
    fn layernorm_forward(
        &self,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        bias: Option<&DeviceTensor>,
        eps: f32,
        out: &mut DeviceTensor,
        mean: &mut DeviceTensor,
        rstd: &mut DeviceTensor,
    ) -> Result<()>;
    #[allow(clippy::too_many_arguments)]
    fn layernorm_backward(
        &self,
        d_out: &DeviceTensor,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        mean: &DeviceTensor,
        rstd: &DeviceTensor,
        d_x: &mut DeviceTensor,
        d_weight: &mut DeviceTensor,
        d_bias: Option<&mut DeviceTensor>,
    ) -> Result<()>;
    /// `out = x / sqrt(mean(x²) + eps) * w`; saves `rstd` `[N]`.
    fn rmsnorm_forward(
        &self,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        eps: f32,
        out: &mut DeviceTensor,
        rstd: &mut DeviceTensor,
    ) -> Result<()>;
    fn rmsnorm_backward(
        &self,
        d_out: &DeviceTensor,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        rstd: &DeviceTensor,
        d_x: &mut DeviceTensor,
        d_weight: &mut DeviceTensor,
    ) -> Result<()>;

    // ---- activations ----------------------------------------------------------------------
    /// GeLU, tanh approximation (Megatron's fused bias-GeLU).
    fn gelu_forward(&self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()>;
    fn gelu_backward(&self, x: &DeviceTensor, d_out: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()>;
    /// `x [N, 2F]` → `out [N, F] = silu(x[:, :F]) * x[:, F:]`.
    fn swiglu_forward(&self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()>;
    fn swiglu_backward(&self, x: &DeviceTensor, d_out: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()>;
    /// Row softmax over the last dim.
    fn softmax_forward(&self, x: &DeviceTensor, out: &mut DeviceTensor) -> Result<()>;
    fn softmax_backward(&self, y: &DeviceTensor, d_y: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()>;
    /// Inverted dropout in place: keep with probability `1-p`, scale kept by `1/(1-p)`. The mask
    /// is a pure function of `(seed, element index)`; backward calls this again on the gradient
    /// with the same seed.
    fn dropout(&self, x: &mut DeviceTensor, p: f32, seed: u64) -> Result<()>;

    // ---- attention and positions ----------------------------------------------------------
    /// See [`AttentionSpec`] for layouts.
    fn attention_forward(
        &self,
        qkv: &DeviceTensor,
        out: &mut DeviceTensor,
        lse: &mut DeviceTensor,
        spec: AttentionSpec,
    ) -> Result<()>;
    /// Writes the whole `d_qkv` (scores recomputed from `qkv` and `lse`).
    fn attention_backward(
        &self,
        d_out: &DeviceTensor,
        qkv: &DeviceTensor,
        out: &DeviceTensor,
        lse: &DeviceTensor,
        d_qkv: &mut DeviceTensor,
        spec: AttentionSpec,
    ) -> Result<()>;
    /// Rotates q and k in place; `inverse` applies the transpose rotation (the backward).
    fn rotary(&self, qkv: &mut DeviceTensor, spec: RotarySpec, inverse: bool) -> Result<()>;

    /// Grouped-query attention: the fused `(N, ng, r+2, hn)` QKV into the per-head
    /// `(N, ng*r, 3, hn)` the attention ops take (see [`crate::gqa`]). The default goes through
    /// the host (exact, a copy); a backend may override it.
    fn gqa_expand(&self, src: &DeviceTensor, dst: &mut DeviceTensor, spec: GqaSpec) -> Result<()> {
        let s = self.to_host(src)?.to_f32_vec();
        let mut d = vec![0.0; spec.expanded_len()];
        crate::gqa::gqa_expand_host(&s, &mut d, spec)?;
        let shape = dst.shape().to_vec();
        *dst = self.from_host(HostBuffer::F32(d), &shape)?;
        Ok(())
    }
    /// The backward of [`Backend::gqa_expand`]: overwrites `d_src (N, ng, r+2, hn)`, summing the
    /// key/value gradients of each group's heads.
    fn gqa_reduce(&self, d_dst: &DeviceTensor, d_src: &mut DeviceTensor, spec: GqaSpec) -> Result<()> {
        let d = self.to_host(d_dst)?.to_f32_vec();
        let mut s = vec![0.0; spec.grouped_len()];
        crate::gqa::gqa_reduce_host(&d, &mut s, spec)?;
        let shape = d_src.shape().to_vec();
        *d_src = self.from_host(HostBuffer::F32(s), &shape)?;
        Ok(())
    }

    /// See [`KvCacheAttentionSpec`]: appends the new k/v to the caches, then attends. Backends
    /// that cannot decode incrementally keep this default, an error naming the backend.
    #[allow(clippy::too_many_arguments)]
    fn attention_kv_cache(
        &self,
        qkv: &DeviceTensor,
        k_cache: &mut DeviceTensor,
        v_cache: &mut DeviceTensor,
        key_start: Option<&DeviceTensor>,
        out: &mut DeviceTensor,
        spec: KvCacheAttentionSpec,
    ) -> Result<()> {
        let _ = (qkv, k_cache, v_cache, key_start, out, spec);
        anyhow::bail!(
            "op `attention_kv_cache` is not supported by backend `{}`; generate with --no-kv-cache \
             (full recompute) or use a backend that implements it (cpu)",
            self.name()
        )
    }

    // ---- embeddings and loss (vocab-parallel pieces, SPEC §5.2/§5.4) -----------------------
    /// `out[i] (+)= table[ids[i] - row_start]`, zero for ids outside
    /// `[row_start, row_start + rows)` (vocab-parallel lookup). `ids` is int32 `[N]`.
    fn embedding_forward(
        &self,
        ids: &DeviceTensor,
        table: &DeviceTensor,
        row_start: usize,
        out: &mut DeviceTensor,
        accumulate: bool,
    ) -> Result<()>;
    /// `d_table[ids[i] - row_start] += d_out[i]` for ids in range.
    fn embedding_backward(
        &self,
        ids: &DeviceTensor,
        d_out: &DeviceTensor,
        row_start: usize,
        d_table: &mut DeviceTensor,
    ) -> Result<()>;
    /// `row_max[i] = max_j logits[i, j]` over this rank's vocab slice.
    fn row_max(&self, logits: &DeviceTensor, row_max: &mut DeviceTensor) -> Result<()>;
    /// With the (all-reduced) `row_max`: `sum_exp[i] = Σ_j exp(logits[i,j] - row_max[i])` and
    /// `target_logit[i] = logits[i, t_i - vocab_start] - row_max[i]` when this rank owns the
    /// target `t_i`, else 0. Both `[N]` f32.
    fn cross_entropy_stats(
        &self,
        logits: &DeviceTensor,
        targets: &DeviceTensor,
        vocab_start: usize,
        row_max: &DeviceTensor,
        sum_exp: &mut DeviceTensor,
        target_logit: &mut DeviceTensor,
    ) -> Result<()>;
    /// Turns `logits` into `d_logits` in place (saves a `[N, V]` buffer):
    /// `d = (softmax - onehot(target)) * d_loss[i]` with the global `row_max`/`sum_exp`.
    fn cross_entropy_backward_inplace(
        &self,
        logits: &mut DeviceTensor,
        targets: &DeviceTensor,
        vocab_start: usize,
        row_max: &DeviceTensor,
        sum_exp: &DeviceTensor,
        d_loss: &DeviceTensor,
    ) -> Result<()>;

    // ---- optimizer steps ------------------------------------------------------------------
    fn adam_step(
        &self,
        param: &mut DeviceTensor,
        grad: &DeviceTensor,
        exp_avg: &mut DeviceTensor,
        exp_avg_sq: &mut DeviceTensor,
        step: AdamStep,
    ) -> Result<()>;
    /// SGD with momentum and (coupled, as torch.optim.SGD) weight decay:
    /// `g' = g + wd p; buf = momentum*buf + g'; p -= lr*buf` (`buf = g'` on the first step).
    #[allow(clippy::too_many_arguments)]
    fn sgd_step(
        &self,
        param: &mut DeviceTensor,
        grad: &DeviceTensor,
        momentum_buf: &mut DeviceTensor,
        lr: f32,
        momentum: f32,
        weight_decay: f32,
        first_step: bool,
    ) -> Result<()>;

    // ---- cross-attention (T5; appended) ----------------------------------------------------
    /// Attention of `q` to `kv` with padding on both sides, an optional causal mask and an
    /// optional additive `(heads, Tq, Tk)` position bias: see [`CrossAttentionSpec`] for the
    /// layouts. Writes `out` and the fp32 `lse`. Backends without it keep this default error.
    #[allow(clippy::too_many_arguments)]
    fn cross_attention_forward(
        &self,
        q: &DeviceTensor,
        kv: &DeviceTensor,
        q_valid: Option<&DeviceTensor>,
        kv_valid: Option<&DeviceTensor>,
        bias: Option<&DeviceTensor>,
        out: &mut DeviceTensor,
        lse: &mut DeviceTensor,
        spec: CrossAttentionSpec,
    ) -> Result<()> {
        let _ = (q, kv, q_valid, kv_valid, bias, out, lse, spec);
        anyhow::bail!("op `cross_attention_forward` is not supported by backend `{}`; use the cpu backend", self.name())
    }
    /// Overwrites `d_q` and `d_kv` (scores recomputed from `q`, `kv`, `bias` and `lse`) and
    /// accumulates `d_bias` `(heads, Tq, Tk)` (summed over the batch in a fixed order) when given.
    #[allow(clippy::too_many_arguments)]
    fn cross_attention_backward(
        &self,
        d_out: &DeviceTensor,
        q: &DeviceTensor,
        kv: &DeviceTensor,
        q_valid: Option<&DeviceTensor>,
        kv_valid: Option<&DeviceTensor>,
        bias: Option<&DeviceTensor>,
        out: &DeviceTensor,
        lse: &DeviceTensor,
        d_q: &mut DeviceTensor,
        d_kv: &mut DeviceTensor,
        d_bias: Option<&mut DeviceTensor>,
        spec: CrossAttentionSpec,
    ) -> Result<()> {
        let _ = (d_out, q, kv, q_valid, kv_valid, bias, out, lse, d_q, d_kv, d_bias, spec);
        anyhow::bail!(
            "op `cross_attention_backward` is not supported by backend `{}`; use the cpu backend",
            self.name()
        )
    }

    /// Continuous batching: attention against a *slotted* key/value cache, where every row of
    /// the call has its own cache slot and its own number of cached tokens. Row `r` of `qkv`
    /// `(B, Tq, heads, 3, head_dim)` is slot `slots[r]` of `k_cache`/`v_cache`
    /// `(S, capacity, heads, head_dim)`: its `Tq` new k/v are written at positions
    /// `[offsets[r], offsets[r] + Tq)` of that slot, and its query `i` attends causally to the
    /// slot's keys `[0, offsets[r] + i]`. `spec.batch` is `B` (rows of this call, distinct
    /// slots); `spec.offset` is unused. Backends without it keep this default error.
    #[allow(clippy::too_many_arguments)]
    fn attention_kv_cache_slots(
        &self,
        qkv: &DeviceTensor,
        k_cache: &mut DeviceTensor,
        v_cache: &mut DeviceTensor,
        slots: &[usize],
        offsets: &[usize],
        out: &mut DeviceTensor,
        spec: KvCacheAttentionSpec,
    ) -> Result<()> {
        let _ = (qkv, k_cache, v_cache, slots, offsets, out, spec);
        anyhow::bail!(
            "op `attention_kv_cache_slots` (continuous batching) is not supported by backend `{}`; \
             serve with --batching static or use the cpu backend",
            self.name()
        )
    }

    /// Many independent f32 matmuls in one call (see [`crate::grouped_gemm::GemmGroup`]); `C`
    /// outside the groups' blocks is left as is. The default runs one [`Backend::gemm`] per
    /// group on host copies; backends override it with one parallel pass over all groups.
    fn grouped_gemm(
        &self,
        a: &DeviceTensor,
        b: &DeviceTensor,
        c: &mut DeviceTensor,
        groups: &[crate::grouped_gemm::GemmGroup],
        spec: crate::grouped_gemm::GroupedGemmSpec,
    ) -> Result<()> {
        crate::grouped_gemm::grouped_gemm_by_loop(self, a, b, c, groups, spec)
    }

    // ---- padded (key-padding-mask) attention, BERT/T5 encoders ------------------------------
    /// Bidirectional attention of row `b`'s first `lengths[b]` tokens among themselves; padded
    /// positions get zero outputs (see [`crate::padded_attention`]). `lengths` is int32 `(B)`.
    /// Backends without it keep this default, an error naming the backend.
    fn attention_padded_forward(
        &self,
        qkv: &DeviceTensor,
        lengths: &DeviceTensor,
        out: &mut DeviceTensor,
        lse: &mut DeviceTensor,
        spec: crate::PaddedAttentionSpec,
    ) -> Result<()> {
        let _ = (qkv, lengths, out, lse, spec);
        anyhow::bail!(
            "op `attention_padded_forward` is not supported by backend `{}`; use the cpu backend",
            self.name()
        )
    }
    /// Writes the whole `d_qkv` (zero at padded positions).
    #[allow(clippy::too_many_arguments)]
    fn attention_padded_backward(
        &self,
        d_out: &DeviceTensor,
        qkv: &DeviceTensor,
        lengths: &DeviceTensor,
        out: &DeviceTensor,
        lse: &DeviceTensor,
        d_qkv: &mut DeviceTensor,
        spec: crate::PaddedAttentionSpec,
    ) -> Result<()> {
        let _ = (d_out, qkv, lengths, out, lse, d_qkv, spec);
        anyhow::bail!(
            "op `attention_padded_backward` is not supported by backend `{}`; use the cpu backend",
            self.name()
        )
    }
    // ---- rotary with rescaled frequencies (Llama-3.1 / linear context extension) ------------
    /// [`Backend::rotary`] with the frequencies `scaling.inv_freq(spec.base, spec.rotary_dim)`
    /// (see [`crate::rope_scaling`]). `RopeScaling::None` is exactly [`Backend::rotary`]; the
    /// default of a scaled rotation goes through the host ([`crate::rope_scaling::rotary_host`],
    /// exact, a copy) and keeps the tensor's dtype; backends override it.
    fn rotary_scaled(
        &self,
        qkv: &mut DeviceTensor,
        spec: RotarySpec,
        scaling: crate::RopeScaling,
        inverse: bool,
    ) -> Result<()> {
        if scaling.is_none() {
            return self.rotary(qkv, spec, inverse);
        }
        let dtype = qkv.dtype();
        let mut x = self.to_host(qkv)?.to_f32_vec();
        crate::rope_scaling::rotary_host(&mut x, &spec, &scaling.inv_freq(spec.base, spec.rotary_dim), inverse)?;
        let shape = qkv.shape().to_vec();
        let f32_tensor = self.from_host(HostBuffer::F32(x), &shape)?;
        if dtype == crate::DType::F32 {
            *qkv = f32_tensor;
            Ok(())
        } else {
            self.cast(&f32_tensor, qkv)
        }
    }

    // ---- Mamba-2 mixer ops (see [`crate::mamba_ops`] for layouts and conventions) ----------
    /// Causal depthwise conv1d + SiLU: overwrites `out` and `pre` (before the SiLU, kept for
    /// the backward). Backends without it keep this default, an error naming the backend.
    fn causal_conv1d_silu_forward(
        &self,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        bias: &DeviceTensor,
        out: &mut DeviceTensor,
        pre: &mut DeviceTensor,
        spec: crate::Conv1dSpec,
    ) -> Result<()> {
        let _ = (x, weight, bias, out, pre, spec);
        mamba_unsupported(self.name(), "causal_conv1d_silu_forward")
    }
    /// Overwrites `d_x`; accumulates `d_weight (Ch, K)` and `d_bias (Ch)`.
    #[allow(clippy::too_many_arguments)]
    fn causal_conv1d_silu_backward(
        &self,
        x: &DeviceTensor,
        weight: &DeviceTensor,
        pre: &DeviceTensor,
        d_out: &DeviceTensor,
        d_x: &mut DeviceTensor,
        d_weight: &mut DeviceTensor,
        d_bias: &mut DeviceTensor,
        spec: crate::Conv1dSpec,
    ) -> Result<()> {
        let _ = (x, weight, pre, d_out, d_x, d_weight, d_bias, spec);
        mamba_unsupported(self.name(), "causal_conv1d_silu_backward")
    }
    /// The SSD chunked scan with the D skip: overwrites `y` and `states`.
    fn ssd_scan_forward(
        &self,
        inputs: crate::SsdTensors,
        y: &mut DeviceTensor,
        states: &mut DeviceTensor,
        spec: crate::SsdSpec,
    ) -> Result<()> {
        let _ = (inputs, y, states, spec);
        mamba_unsupported(self.name(), "ssd_scan_forward")
    }
    /// Overwrites every gradient in `grads` from `dy` and the forward's `states`.
    fn ssd_scan_backward(
        &self,
        inputs: crate::SsdTensors,
        states: &DeviceTensor,
        dy: &DeviceTensor,
        grads: crate::SsdGradTensors,
        spec: crate::SsdSpec,
    ) -> Result<()> {
        let _ = (inputs, states, dy, grads, spec);
        mamba_unsupported(self.name(), "ssd_scan_backward")
    }
    /// Gated RMSNorm per group (`norm_before_gate=False`): overwrites `out` and `rstd`.
    #[allow(clippy::too_many_arguments)]
    fn gated_rmsnorm_forward(
        &self,
        y: &DeviceTensor,
        z: &DeviceTensor,
        weight: &DeviceTensor,
        groups: usize,
        eps: f32,
        out: &mut DeviceTensor,
        rstd: &mut DeviceTensor,
    ) -> Result<()> {
        let _ = (y, z, weight, groups, eps, out, rstd);
        mamba_unsupported(self.name(), "gated_rmsnorm_forward")
    }
    /// Overwrites `d_y`, `d_z`; accumulates `d_weight`.
    #[allow(clippy::too_many_arguments)]
    fn gated_rmsnorm_backward(
        &self,
        y: &DeviceTensor,
        z: &DeviceTensor,
        weight: &DeviceTensor,
        groups: usize,
        rstd: &DeviceTensor,
        d_out: &DeviceTensor,
        d_y: &mut DeviceTensor,
        d_z: &mut DeviceTensor,
        d_weight: &mut DeviceTensor,
    ) -> Result<()> {
        let _ = (y, z, weight, groups, rstd, d_out, d_y, d_z, d_weight);
        mamba_unsupported(self.name(), "gated_rmsnorm_backward")
    }

    // ---- ring attention blocks (context parallelism) -----------------------------------------
    /// Attention of `q (B, Tq, heads, hd)` to one K/V block `(B, Tk, heads, hd)` with causal
    /// masking by the int32 global positions `q_pos (Tq)`, `k_pos (Tk)`: writes `out (B, Tq,
    /// heads, hd)` and `lse (B, heads, Tq)` (see [`crate::attention_block`]). Backends without
    /// it keep this default, an error naming the backend.
    #[allow(clippy::too_many_arguments)]
    fn attention_block_forward(
        &self,
        q: &DeviceTensor,
        k: &DeviceTensor,
        v: &DeviceTensor,
        q_pos: &DeviceTensor,
        k_pos: &DeviceTensor,
        out: &mut DeviceTensor,
        lse: &mut DeviceTensor,
        spec: crate::AttentionBlockSpec,
    ) -> Result<()> {
        let _ = (q, k, v, q_pos, k_pos, out, lse, spec);
        anyhow::bail!("op `attention_block_forward` is not supported by backend `{}`; use the cpu backend", self.name())
    }
    /// Merges a block's `(block_out, block_lse)` into the running `(out, lse)` by their
    /// log-sum-exp (see [`crate::attention_block`]).
    fn attention_lse_merge(
        &self,
        out: &mut DeviceTensor,
        lse: &mut DeviceTensor,
        block_out: &DeviceTensor,
        block_lse: &DeviceTensor,
        spec: crate::AttentionBlockSpec,
    ) -> Result<()> {
        let _ = (out, lse, block_out, block_lse, spec);
        anyhow::bail!("op `attention_lse_merge` is not supported by backend `{}`; use the cpu backend", self.name())
    }
    /// Adds one block's part of the attention backward to `dq`, `dk`, `dv`, given the merged
    /// output's final `lse` and `delta = Σ dO·O` `(B, heads, Tq)` (see [`crate::attention_block`]).
    #[allow(clippy::too_many_arguments)]
    fn attention_block_backward(
        &self,
        d_out: &DeviceTensor,
        q: &DeviceTensor,
        k: &DeviceTensor,
        v: &DeviceTensor,
        q_pos: &DeviceTensor,
        k_pos: &DeviceTensor,
        lse: &DeviceTensor,
        delta: &DeviceTensor,
        dq: &mut DeviceTensor,
        dk: &mut DeviceTensor,
        dv: &mut DeviceTensor,
        spec: crate::AttentionBlockSpec,
    ) -> Result<()> {
        let _ = (d_out, q, k, v, q_pos, k_pos, lse, delta, dq, dk, dv, spec);
        anyhow::bail!(
            "op `attention_block_backward` is not supported by backend `{}`; use the cpu backend",
            self.name()
        )
    }
}

fn mamba_unsupported(backend: &str, op: &str) -> Result<()> {
    anyhow::bail!("op `{op}` (Mamba-2 mixer) is not supported by backend `{backend}`; use the cpu backend")
}
