//! Specs and providers (Megatron-Core's `ModuleSpec` / `BackendSpecProvider`, SPEC §12.2).
//!
//! A model is assembled from a [`TransformerConfig`] (sizes, dropout, init), a
//! [`TransformerBlockSpec`] (what goes into each slot of each layer) and a [`SpecProvider`]
//! (which implementation builds a linear or a norm). A different backend, MoE or TP scheme is
//! a different provider or spec, never an edited model.

use crate::init::ModuleBuilder;
use crate::linear::{ColumnParallelLinear, LinearConfig, LinearLayer, RowParallelLinear};
use crate::norm::{LayerNorm, NormKind, NormLayer, RmsNorm};
use crate::sequence_parallel::{SequenceParallelColumnLinear, SequenceParallelRowLinear};
use anyhow::{bail, Result};

/// Rotary position embedding of the attention's q and k (`--position-embedding-type rope`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RotaryConfig {
    /// `--rotary-base` (theta).
    pub base: f32,
    /// `--rotary-percent`: the fraction of each head's channels that rotate.
    pub percent: f32,
    /// `--rotary-interleaved`: rotate adjacent pairs instead of the two halves.
    pub interleaved: bool,
    /// Rescaled frequencies (`--use-rope-scaling`, `--rotary-seq-len-interpolation-factor`).
    pub scaling: megatron_core::RopeScaling,
}

/// Sizes and hyper-parameters shared by every layer (Megatron's `TransformerConfig`).
/// `Default` is all zeros/off, for `..Default::default()` in literals.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TransformerConfig {
    pub num_layers: usize,
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    /// MLP inner size (per gate/up half when gated).
    pub ffn_hidden_size: usize,
    pub layernorm_epsilon: f32,
    pub hidden_dropout: f32,
    pub attention_dropout: f32,
    /// `init_method` std; output layers (linear_proj, linear_fc2) use `std / sqrt(2 L)`.
    pub init_method_std: f32,
    /// `--num-query-groups` with `--group-query-attention`; `None` is multi-head (ng = np).
    pub num_query_groups: Option<usize>,
    /// `--kv-channels` (per-head size); `None` is `hidden_size / num_attention_heads`.
    pub kv_channels: Option<usize>,
    /// Rotary embedding applied inside every attention (`None`: positions come from elsewhere).
    pub rotary: Option<RotaryConfig>,
    /// `--qk-layernorm`: this norm over `head_dim` of every query and key (`None`: off).
    pub qk_layernorm: Option<NormKind>,
}

impl TransformerConfig {
    pub fn head_dim(&self) -> usize {
        self.kv_channels.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Query groups `ng` (equal to the heads without GQA).
    pub fn query_groups(&self) -> usize {
        self.num_query_groups.unwrap_or(self.num_attention_heads)
    }

    /// `output_layer_init_method` std (SPEC §4.6).
    pub fn output_init_std(&self) -> f32 {
        self.init_method_std / (2.0 * self.num_layers as f32).sqrt()
    }

    /// Checks the divisibility rules of SPEC §4.2/§4.3 for a TP group of `tp`.
    pub fn validate(&self, tp: usize) -> Result<()> {
        let c = self;
        if c.num_layers == 0 || c.hidden_size == 0 || c.num_attention_heads == 0 || c.ffn_hidden_size == 0 {
            bail!("num_layers, hidden_size, num_attention_heads and ffn_hidden_size must all be >= 1");
        }
        let ng = c.query_groups();
        if ng == 0 || !c.num_attention_heads.is_multiple_of(ng) {
            bail!("num_attention_heads {} is not divisible by --num-query-groups {ng}", c.num_attention_heads);
        }
        if !ng.is_multiple_of(tp) {
            bail!("--num-query-groups {ng} must be divisible by --tensor-model-parallel-size {tp}");
        }
        if let Some(r) = c.rotary {
            let rot = (c.head_dim() as f32 * r.percent) as usize;
            if !(r.percent > 0.0 && r.percent <= 1.0) || rot < 2 || !rot.is_multiple_of(2) {
                bail!(
                    "--rotary-percent {} of head_dim {} gives {rot} rotary channels; it must give an even number >= 2",
                    r.percent,
                    c.head_dim()
                );
            }
            if !(r.base > 0.0 && r.base.is_finite()) {
                bail!("--rotary-base must be > 0, got {}", r.base);
            }
            r.scaling.validate()?;
        }
        if c.kv_channels == Some(0) {
            bail!("--kv-channels must be >= 1");
        }
        if c.kv_channels.is_none() && !c.hidden_size.is_multiple_of(c.num_attention_heads) {
            bail!(
                "hidden_size {} is not divisible by num_attention_heads {}; pick sizes with hidden = heads x head_dim",
                c.hidden_size,
                c.num_attention_heads
            );
        }
        if !c.num_attention_heads.is_multiple_of(tp) || !c.ffn_hidden_size.is_multiple_of(tp) {
            bail!(
                "num_attention_heads {} and ffn_hidden_size {} must be divisible by --tensor-model-parallel-size {tp}",
                c.num_attention_heads,
                c.ffn_hidden_size
            );
        }
        for (name, p) in [("hidden_dropout", c.hidden_dropout), ("attention_dropout", c.attention_dropout)] {
            if !(0.0..1.0).contains(&p) {
                bail!("{name} = {p} must be in [0, 1)");
            }
        }
        Ok(())
    }
}

/// MLP activation (SPEC §4.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// Fused bias-GeLU, tanh approximation (Megatron's local spec default).
    GeluTanh,
    /// Gated SiLU; fc1 produces `[gate; up]`.
    SwiGlu,
}

/// Slots of the self-attention module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SelfAttentionSpec {
    /// Biases on linear_qkv and linear_proj.
    pub bias: bool,
    /// A bias on linear_qkv even without `bias` (`--add-qkv-bias`, Qwen2).
    pub qkv_bias: bool,
    pub causal: bool,
}

/// Slots of the MLP module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlpSpec {
    pub activation: Activation,
    /// Biases on linear_fc1 and linear_fc2.
    pub bias: bool,
}

/// Slots of one pre-norm transformer layer (Megatron's `TransformerLayerSubmodules`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransformerLayerSpec {
    pub input_layernorm: NormKind,
    pub self_attention: SelfAttentionSpec,
    pub pre_mlp_layernorm: NormKind,
    pub mlp: MlpSpec,
}

/// One spec per layer (heterogeneous stacks allowed) plus the final norm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransformerBlockSpec {
    pub layers: Vec<TransformerLayerSpec>,
    pub final_layernorm: Option<NormKind>,
}

/// `get_gpt_layer_local_spec`: causal attention, `norm` everywhere, GeLU or SwiGLU.
pub fn gpt_layer_local_spec(norm: NormKind, swiglu: bool, bias: bool) -> TransformerLayerSpec {
    TransformerLayerSpec {
        input_layernorm: norm,
        self_attention: SelfAttentionSpec { bias, qkv_bias: bias, causal: true },
        pre_mlp_layernorm: norm,
        mlp: MlpSpec { activation: if swiglu { Activation::SwiGlu } else { Activation::GeluTanh }, bias },
    }
}

/// `get_gpt_decoder_block_spec` for a dense model: `num_layers` copies of `layer` and a final norm.
pub fn gpt_decoder_block_spec(layer: TransformerLayerSpec, num_layers: usize) -> TransformerBlockSpec {
    TransformerBlockSpec { layers: vec![layer; num_layers], final_layernorm: Some(layer.input_layernorm) }
}

/// Builds the leaf modules a spec asks for (Megatron's `BackendSpecProvider`).
pub trait SpecProvider: Send + Sync {
    fn column_parallel_linear(
        &self,
        b: &ModuleBuilder,
        prefix: &str,
        cfg: LinearConfig,
    ) -> Result<Box<dyn LinearLayer>>;
    fn row_parallel_linear(&self, b: &ModuleBuilder, prefix: &str, cfg: LinearConfig) -> Result<Box<dyn LinearLayer>>;
    fn norm(
        &self,
        b: &ModuleBuilder,
        prefix: &str,
        kind: NormKind,
        hidden: usize,
        eps: f32,
    ) -> Result<Box<dyn NormLayer>>;
    /// A module from an `mlp` plugin for the MLP slot of layer `layer_number`, or `None` for
    /// the dense MLP (the default; see [`crate::mlp_slot::WithMlpProvider`]).
    fn mlp_module(
        &self,
        _b: &ModuleBuilder,
        _prefix: &str,
        _cfg: &TransformerConfig,
        _spec: MlpSpec,
        _layer_number: usize,
    ) -> Result<Option<Box<dyn megatron_core::MlpModule>>> {
        Ok(None)
    }
}

/// The local (pure Megatron-Core) tensor-parallel provider: gemm-based parallel linears and
/// backend norms; the sequence-parallel linears when the builder has `sequence_parallel`.
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalSpecProvider;

impl SpecProvider for LocalSpecProvider {
    fn column_parallel_linear(
        &self,
        b: &ModuleBuilder,
        prefix: &str,
        cfg: LinearConfig,
    ) -> Result<Box<dyn LinearLayer>> {
        if b.sequence_parallel {
            return Ok(Box::new(SequenceParallelColumnLinear::new(b, prefix, cfg)?));
        }
        Ok(Box::new(ColumnParallelLinear::new(b, prefix, cfg)?))
    }

    fn row_parallel_linear(&self, b: &ModuleBuilder, prefix: &str, cfg: LinearConfig) -> Result<Box<dyn LinearLayer>> {
        if b.sequence_parallel {
            return Ok(Box::new(SequenceParallelRowLinear::new(b, prefix, cfg)?));
        }
        Ok(Box::new(RowParallelLinear::new(b, prefix, cfg)?))
    }

    fn norm(
        &self,
        b: &ModuleBuilder,
        prefix: &str,
        kind: NormKind,
        hidden: usize,
        eps: f32,
    ) -> Result<Box<dyn NormLayer>> {
        Ok(match kind {
            NormKind::LayerNorm => Box::new(LayerNorm::new(b, prefix, hidden, eps)?),
            NormKind::RMSNorm => Box::new(RmsNorm::new(b, prefix, hidden, eps)?),
        })
    }
}
