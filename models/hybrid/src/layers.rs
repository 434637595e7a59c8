//! One layer of a hybrid stack: a pre-norm residual branch holding a Mamba-2 mixer (`M`,
//! Megatron's `MambaLayer`), a self-attention (`*`) or an MLP (`-`), the last two being the
//! transformer crate's modules: `y = x + dropout(branch(norm(x)))`.
//!
//! Parameter names follow Megatron-Core's hybrid model: `{p}.norm.weight` + `{p}.mixer.*`,
//! `{p}.input_layernorm.weight` + `{p}.self_attention.*`, `{p}.pre_mlp_layernorm.weight` +
//! `{p}.mlp.*`; an MoE layer (`E`) is `{p}.pre_mlp_layernorm.weight` + the MoE plugin's
//! `{p}.mlp.*` (router, experts), the module the `mlp` plugin registers (as the GPT model gets it).

use crate::config::{HybridConfig, LayerKind};
use crate::mixer::{MambaMixer, MixerDims, Saved};
use anyhow::{Context, Result};
use megatron_core::{Backend, DType, DeviceTensor, MlpProvider, Param};
use megatron_transformer::layer::hidden_dropout;
use megatron_transformer::step::{empty, ensure_buffer, SavedActivations};
use megatron_transformer::{
    gpt_layer_local_spec, LocalSpecProvider, Mlp, MlpSlot, ModuleBuilder, ModuleScratch, NormLayer, SelfAttention,
    SpecProvider, StepInfo, WithMlpProvider,
};
use megatron_transformer::{DropoutSite, TransformerConfig};
use std::sync::Arc;

pub enum Branch {
    Mamba(Box<MambaMixer>),
    Attention(Box<SelfAttention>),
    Mlp(Mlp),
    /// `E`: always the plugin's module ([`MlpSlot::Plugin`]).
    Moe(MlpSlot),
}

/// What one layer's training forward left in its modules for backward, moved out of them
/// (handle moves, no copies) while other microbatches run on the same pipeline stage.
pub(crate) struct LayerState {
    normed: DeviceTensor,   // (B, T, C)
    mixer: Saved,           // `M` layers
    acts: SavedActivations, // the norm's statistics, the attention/MLP buffers
}

pub struct HybridLayer {
    pub(crate) backend: Arc<dyn Backend>,
    pub kind: LayerKind,
    pub layer_number: usize,
    pub norm: Box<dyn NormLayer>,
    pub branch: Branch,
    hidden_dropout: f32,
    /// dtype of the norm output and the branch gradients (the model's activation dtype).
    act: DType,
    normed: DeviceTensor, // (B, T, C): norm(x), the branch input
}

impl HybridLayer {
    pub fn new(
        b: &ModuleBuilder,
        cfg: &HybridConfig,
        tcfg: &TransformerConfig,
        kind: LayerKind,
        i: usize,
        mlp: Option<&MlpProvider>,
    ) -> Result<Self> {
        let p = format!("decoder.layers.{i}");
        let provider = LocalSpecProvider;
        let spec = gpt_layer_local_spec(cfg.normalization, false, false);
        let (h, eps) = (cfg.hidden_size, cfg.layernorm_epsilon);
        let norm_name = match kind {
            LayerKind::Mamba => "norm",
            LayerKind::Attention => "input_layernorm",
            LayerKind::Mlp | LayerKind::Moe => "pre_mlp_layernorm",
        };
        let norm = provider.norm(b, &format!("{p}.{norm_name}"), cfg.normalization, h, eps)?;
        let branch = match kind {
            LayerKind::Mamba => {
                let dims = MixerDims {
                    hidden: h,
                    heads: cfg.mamba_heads(),
                    head_dim: cfg.mamba_head_dim,
                    groups: cfg.mamba_num_groups,
                    state: cfg.mamba_state_dim,
                    conv: cfg.mamba_conv_kernel,
                    chunk: cfg.mamba_chunk_size,
                };
                let (std, out_std) = (cfg.init_method_std, tcfg.output_init_std());
                Branch::Mamba(Box::new(MambaMixer::new(b, &format!("{p}.mixer"), dims, std, out_std, eps)?))
            }
            LayerKind::Attention => {
                let name = format!("{p}.self_attention");
                Branch::Attention(Box::new(SelfAttention::new(b, &provider, &name, tcfg, spec.self_attention, i)?))
            }
            LayerKind::Mlp => Branch::Mlp(Mlp::new(b, &provider, &format!("{p}.mlp"), tcfg, spec.mlp)?),
            LayerKind::Moe => {
                let Some(mlp) = mlp else {
                    anyhow::bail!(
                        "--hybrid-layer-pattern `{}`: layer {i} is an `E` (MoE) layer, which needs the MoE plugin: \
                         build with --features moe or load it with --plugin libmegatron_moe.so, and set --num-experts",
                        cfg.hybrid_layer_pattern
                    );
                };
                let with = WithMlpProvider { inner: &provider, mlp };
                let Some(m) = with.mlp_module(b, &format!("{p}.mlp"), tcfg, spec.mlp, i)? else {
                    anyhow::bail!(
                        "--hybrid-layer-pattern: the `{}` plugin left `E` layer {i} dense (--moe-layer-freq); every `E` \
                         layer must be an MoE layer: use --moe-layer-freq 1 (the pattern already says where they are)",
                        mlp.name
                    );
                };
                Branch::Moe(MlpSlot::Plugin(m))
            }
        };
        let backend = b.backend.clone();
        Ok(HybridLayer {
            normed: empty(backend.as_ref())?,
            backend,
            kind,
            layer_number: i,
            norm,
            branch,
            hidden_dropout: cfg.hidden_dropout,
            act: b.dtype(),
        })
    }

    fn site(&self) -> DropoutSite {
        if self.kind == LayerKind::Attention {
            DropoutSite::AttentionOutput
        } else {
            DropoutSite::MlpOutput
        }
    }

    /// `y (B, T, C) = x + dropout(branch(norm(x)))`.
    pub fn forward(&mut self, x: &DeviceTensor, y: &mut DeviceTensor, step: &StepInfo) -> Result<()> {
        let be = self.backend.clone();
        let be = be.as_ref();
        ensure_buffer(be, &mut self.normed, x.shape(), self.act)?;
        self.norm.forward(x, &mut self.normed)?;
        match &mut self.branch {
            Branch::Mamba(m) => m.forward(&self.normed, y, step.batch, step.seq)?,
            Branch::Attention(a) => a.forward(&self.normed, y, step)?,
            Branch::Mlp(m) => m.forward(&self.normed, y, step)?,
            Branch::Moe(m) => m.forward(&self.normed, y, step)?,
        }
        hidden_dropout(be, y, self.hidden_dropout, self.layer_number, self.site(), step)?;
        be.axpy(y, 1.0, x)
    }

    /// On entry `d_res` is `dL/dy`, on exit `dL/dx`; `x` is this layer's input.
    pub fn backward(
        &mut self,
        x: &DeviceTensor,
        d_res: &mut DeviceTensor,
        d_branch: &mut DeviceTensor,
        d_norm: &mut DeviceTensor,
        scratch: &mut ModuleScratch,
        step: &StepInfo,
    ) -> Result<()> {
        let be = self.backend.clone();
        let be = be.as_ref();
        // d_branch carries residual-stream gradients, d_norm the norm's (activation dtype).
        ensure_buffer(be, d_branch, d_res.shape(), d_res.dtype())?;
        ensure_buffer(be, d_norm, d_res.shape(), self.act)?;
        be.copy(d_res, d_branch)?;
        hidden_dropout(be, d_branch, self.hidden_dropout, self.layer_number, self.site(), step)?;
        let ctx = || format!("backward of hybrid layer {} ({:?})", self.layer_number, self.kind);
        match &mut self.branch {
            Branch::Mamba(m) => m.backward(&self.normed, d_branch, d_norm),
            Branch::Attention(a) => a.backward(&self.normed, d_branch, d_norm, scratch, step),
            Branch::Mlp(m) => m.backward(&self.normed, d_branch, d_norm, scratch),
            Branch::Moe(m) => m.backward(&self.normed, d_branch, d_norm, scratch),
        }
        .with_context(ctx)?;
        self.norm.backward(d_norm, x, d_branch).with_context(ctx)?;
        be.axpy(d_res, 1.0, d_branch)
    }

    /// Marks the following training forwards as recomputations (full recomputation): an MoE
    /// branch then counts no routing statistics again ([`megatron_core::MlpModule::set_recomputing`]).
    pub(crate) fn set_recomputing(&mut self, recomputing: bool) -> Result<()> {
        match &mut self.branch {
            Branch::Moe(m) => m.set_recomputing(recomputing),
            _ => Ok(()),
        }
    }

    /// The module buffers a training forward fills for backward: the norm's statistics and
    /// the attention/MLP tensors (the mixer keeps its own [`Saved`]).
    fn saved_slots(&mut self) -> Vec<&mut DeviceTensor> {
        let mut v = self.norm.saved_activations_mut();
        match &mut self.branch {
            Branch::Mamba(_) => {}
            Branch::Attention(a) => v.extend(a.saved_activations_mut()),
            Branch::Mlp(m) => v.extend(m.saved_activations_mut()),
            Branch::Moe(m) => v.extend(m.saved_activations_mut()),
        }
        v
    }

    /// Moves this layer's saved activations out (see [`LayerState`]).
    pub(crate) fn take_state(&mut self) -> Result<LayerState> {
        let be = self.backend.clone();
        let normed = std::mem::replace(&mut self.normed, empty(be.as_ref())?);
        let mixer = match &mut self.branch {
            Branch::Mamba(m) => m.take_saved(),
            _ => Saved::default(),
        };
        let slots = self.saved_slots();
        let mut acts = SavedActivations::placeholders(be.as_ref(), slots.len())?;
        acts.swap_with(slots)?;
        Ok(LayerState { normed, mixer, acts })
    }

    /// Puts a [`LayerState`] taken by [`Self::take_state`] back for its backward.
    pub(crate) fn put_state(&mut self, mut state: LayerState) -> Result<()> {
        self.normed = state.normed;
        if let Branch::Mamba(m) = &mut self.branch {
            m.put_saved(state.mixer);
        }
        state.acts.swap_with(self.saved_slots())
    }

    pub fn params(&self) -> Vec<&Param> {
        let mut v = self.norm.params();
        match &self.branch {
            Branch::Mamba(m) => v.extend(m.params()),
            Branch::Attention(a) => v.extend(a.params()),
            Branch::Mlp(m) => v.extend(m.params()),
            Branch::Moe(m) => v.extend(m.params()),
        }
        v
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut v = self.norm.params_mut();
        match &mut self.branch {
            Branch::Mamba(m) => v.extend(m.params_mut()),
            Branch::Attention(a) => v.extend(a.params_mut()),
            Branch::Mlp(m) => v.extend(m.params_mut()),
            Branch::Moe(m) => v.extend(m.params_mut()),
        }
        v
    }
}
