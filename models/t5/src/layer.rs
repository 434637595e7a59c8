//! One T5 transformer layer (SPEC §4.1, pre-norm): encoder layers are self-attention + MLP,
//! decoder layers insert cross-attention to the encoder output between them:
//! ```text
//! h1 = x  + Dropout(SelfAttn(Norm_1(x)))
//! h2 = h1 + Dropout(CrossAttn(Norm_x(h1), memory))      (decoder only; else h2 = h1)
//! y  = h2 + Dropout(MLP(Norm_2(h2)))
//! ```
//! Norms are `input_layernorm`, `pre_cross_attn_layernorm`, `pre_mlp_layernorm`
//! (Megatron-Core's T5 names).

use crate::attention::{AttnInputs, T5Attention};
use crate::mlp::T5Mlp;
use anyhow::Result;
use megatron_core::{Backend, DType, DeviceTensor, Param};
use megatron_transformer::{DropoutSite, LayerNorm, ModuleBuilder, NormKind, NormLayer, RmsNorm, StepInfo};
use std::sync::Arc;

pub fn norm(b: &ModuleBuilder, prefix: &str, kind: NormKind, hidden: usize, eps: f32) -> Result<Box<dyn NormLayer>> {
    Ok(match kind {
        NormKind::LayerNorm => Box::new(LayerNorm::new(b, prefix, hidden, eps)?),
        NormKind::RMSNorm => Box::new(RmsNorm::new(b, prefix, hidden, eps)?),
    })
}

pub struct T5Layer {
    backend: Arc<dyn Backend>,
    pub input_layernorm: Box<dyn NormLayer>,
    pub self_attention: T5Attention,
    pub cross: Option<(Box<dyn NormLayer>, T5Attention)>,
    pub pre_mlp_layernorm: Box<dyn NormLayer>,
    pub mlp: T5Mlp,
    hidden_dropout: f32,
    /// Dropout-seed id of this layer.
    id: usize,
    /// Activation dtype of training (the residual stream too); incremental decoding runs
    /// its activations in fp32 over the same parameters.
    dtype: DType,
    // Saved for backward, all (N, C):
    x: Option<DeviceTensor>,
    ln1: Option<DeviceTensor>,
    h1: Option<DeviceTensor>,
    lnx: Option<DeviceTensor>,
    h2: Option<DeviceTensor>,
    ln2: Option<DeviceTensor>,
}

impl T5Layer {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        backend: Arc<dyn Backend>,
        input_layernorm: Box<dyn NormLayer>,
        self_attention: T5Attention,
        cross: Option<(Box<dyn NormLayer>, T5Attention)>,
        pre_mlp_layernorm: Box<dyn NormLayer>,
        mlp: T5Mlp,
        hidden_dropout: f32,
        id: usize,
        dtype: DType,
    ) -> T5Layer {
        T5Layer {
            backend,
            input_layernorm,
            self_attention,
            cross,
            pre_mlp_layernorm,
            mlp,
            hidden_dropout,
            id,
            dtype,
            x: None,
            ln1: None,
            h1: None,
            lnx: None,
            h2: None,
            ln2: None,
        }
    }

    fn dropout(&self, t: &mut DeviceTensor, site: DropoutSite, sub: usize, step: &StepInfo) -> Result<()> {
        let p = step.dropout_p(self.hidden_dropout);
        if p > 0.0 {
            self.backend.dropout(t, p, step.dropout_seed(self.id * 4 + sub, site, 0))?;
        }
        Ok(())
    }

    /// `y (N, C)` from `x (N, C)`; keeps what backward needs.
    pub fn forward(
        &mut self,
        x: DeviceTensor,
        memory: Option<&DeviceTensor>,
        self_in: AttnInputs,
        cross_in: Option<AttnInputs>,
        step: &StepInfo,
    ) -> Result<DeviceTensor> {
        let be = self.backend.clone();
        let be = be.as_ref();
        let dtype = self.dtype;
        let z = |t: &DeviceTensor| be.zeros(t.shape(), dtype);
        let mut ln1 = z(&x)?;
        self.input_layernorm.forward(&x, &mut ln1)?;
        let mut a = z(&x)?;
        self.self_attention.forward(&ln1, None, self_in, &mut a, step)?;
        self.dropout(&mut a, DropoutSite::AttentionOutput, 0, step)?;
        let mut h1 = z(&x)?;
        be.add(&x, &a, &mut h1)?;
        let (mut lnx, mut h2) = (None, None);
        if let Some((nx, cross)) = &mut self.cross {
            let mut l = z(&x)?;
            nx.forward(&h1, &mut l)?;
            let mut c = z(&x)?;
            cross.forward(&l, memory, cross_in.expect("decoder layer without cross inputs"), &mut c, step)?;
            let p = step.dropout_p(self.hidden_dropout);
            if p > 0.0 {
                be.dropout(&mut c, p, step.dropout_seed(self.id * 4 + 1, DropoutSite::AttentionOutput, 0))?;
            }
            let mut h = z(&x)?;
            be.add(&h1, &c, &mut h)?;
            lnx = Some(l);
            h2 = Some(h);
        }
        let mid = h2.as_ref().unwrap_or(&h1);
        let mut ln2 = z(&x)?;
        self.pre_mlp_layernorm.forward(mid, &mut ln2)?;
        let mut m = z(&x)?;
        self.mlp.forward(&ln2, x.shape()[0], &mut m)?;
        self.dropout(&mut m, DropoutSite::MlpOutput, 2, step)?;
        let mut y = z(&x)?;
        be.add(mid, &m, &mut y)?;
        if step.train {
            (self.x, self.ln1, self.h1, self.lnx, self.h2, self.ln2) =
                (Some(x), Some(ln1), Some(h1), lnx, h2, Some(ln2));
        }
        Ok(y)
    }

    /// `d_x (N, C)` from `d_y (N, C)`; adds into `d_memory` (decoder) and `d_self_bias`.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &mut self,
        d_y: DeviceTensor,
        memory: Option<&DeviceTensor>,
        self_in: AttnInputs,
        cross_in: Option<AttnInputs>,
        d_memory: Option<&mut DeviceTensor>,
        d_self_bias: Option<&mut DeviceTensor>,
        step: &StepInfo,
    ) -> Result<DeviceTensor> {
        let be = self.backend.clone();
        let be = be.as_ref();
        let missing = || anyhow::anyhow!("t5 layer backward without a training forward");
        let (x, ln1, h1, ln2) = (
            self.x.take().ok_or_else(missing)?,
            self.ln1.take().ok_or_else(missing)?,
            self.h1.take().ok_or_else(missing)?,
            self.ln2.take().ok_or_else(missing)?,
        );
        let (lnx, h2) = (self.lnx.take(), self.h2.take());
        let dtype = self.dtype;
        let z = |t: &DeviceTensor| be.zeros(t.shape(), dtype);
        // y = mid + drop(mlp(norm2(mid)))
        let mut d_m = z(&d_y)?;
        be.copy(&d_y, &mut d_m)?;
        self.dropout(&mut d_m, DropoutSite::MlpOutput, 2, step)?;
        let mut d_ln2 = z(&d_y)?;
        self.mlp.backward(&ln2, &d_m, &mut d_ln2)?;
        let mid = h2.as_ref().unwrap_or(&h1);
        let mut d_mid = z(&d_y)?;
        self.pre_mlp_layernorm.backward(&d_ln2, mid, &mut d_mid)?;
        be.axpy(&mut d_mid, 1.0, &d_y)?;
        // h2 = h1 + drop(cross(norm_x(h1)))
        let d_h1 = if let Some((nx, cross)) = &mut self.cross {
            let lnx = lnx.ok_or_else(missing)?;
            let mut d_c = z(&d_mid)?;
            be.copy(&d_mid, &mut d_c)?;
            let p = step.dropout_p(self.hidden_dropout);
            if p > 0.0 {
                be.dropout(&mut d_c, p, step.dropout_seed(self.id * 4 + 1, DropoutSite::AttentionOutput, 0))?;
            }
            let mut d_lnx = z(&d_mid)?;
            cross.backward(
                &lnx,
                memory,
                cross_in.expect("decoder layer without cross inputs"),
                &d_c,
                &mut d_lnx,
                d_memory,
                None,
            )?;
            let mut d = z(&d_mid)?;
            nx.backward(&d_lnx, &h1, &mut d)?;
            be.axpy(&mut d, 1.0, &d_mid)?;
            d
        } else {
            d_mid
        };
        // h1 = x + drop(self_attn(norm1(x)))
        let mut d_a = z(&d_h1)?;
        be.copy(&d_h1, &mut d_a)?;
        self.dropout(&mut d_a, DropoutSite::AttentionOutput, 0, step)?;
        let mut d_ln1 = z(&d_h1)?;
        self.self_attention.backward(&ln1, None, self_in, &d_a, &mut d_ln1, None, d_self_bias)?;
        let mut d_x = z(&d_h1)?;
        self.input_layernorm.backward(&d_ln1, &x, &mut d_x)?;
        be.axpy(&mut d_x, 1.0, &d_h1)?;
        Ok(d_x)
    }

    /// Incremental decoding (inference, batch 1, no dropout): the newest decoder position
    /// `x (1, C)` through this decoder layer, the same sums as [`Self::forward`]; its
    /// self-attention key/value row is appended to `self_kv`, cross-attention uses the cached
    /// `cross_kv (S_enc, heads, 2, hd)` with `enc_valid` keys.
    pub fn decode_step(
        &mut self,
        x: &DeviceTensor,
        self_kv: &mut Vec<f32>,
        self_bias: Option<&DeviceTensor>,
        cross_kv: &DeviceTensor,
        enc_valid: &DeviceTensor,
    ) -> Result<DeviceTensor> {
        let be = self.backend.clone();
        let be = be.as_ref();
        let z = |t: &DeviceTensor| be.zeros(t.shape(), DType::F32);
        let mut ln1 = z(x)?;
        self.input_layernorm.forward(x, &mut ln1)?;
        let mut a = z(x)?;
        self.self_attention.decode_self(&ln1, self_kv, self_bias, &mut a)?;
        let mut h1 = z(x)?;
        be.add(x, &a, &mut h1)?;
        let Some((nx, cross)) = &mut self.cross else { anyhow::bail!("t5 decode_step on an encoder layer") };
        let mut l = z(x)?;
        nx.forward(&h1, &mut l)?;
        let mut c = z(x)?;
        cross.decode_cross(&l, cross_kv, enc_valid, &mut c)?;
        let mut h2 = z(x)?;
        be.add(&h1, &c, &mut h2)?;
        let mut ln2 = z(x)?;
        self.pre_mlp_layernorm.forward(&h2, &mut ln2)?;
        let mut m = z(x)?;
        self.mlp.forward(&ln2, x.shape()[0], &mut m)?;
        let mut y = z(x)?;
        be.add(&h2, &m, &mut y)?;
        Ok(y)
    }

    /// Frees every tensor kept for backward (full recomputation: the unit's forward is re-run
    /// from its input before the backward).
    pub fn drop_saved(&mut self) -> Result<()> {
        (self.x, self.ln1, self.h1, self.lnx, self.h2, self.ln2) = (None, None, None, None, None, None);
        self.self_attention.drop_saved()?;
        if let Some((_, c)) = &mut self.cross {
            c.drop_saved()?;
        }
        self.mlp.drop_saved()
    }

    pub fn params(&self) -> Vec<&Param> {
        let mut v = self.input_layernorm.params();
        v.extend(self.self_attention.params());
        if let Some((n, c)) = &self.cross {
            v.extend(n.params());
            v.extend(c.params());
        }
        v.extend(self.pre_mlp_layernorm.params());
        v.extend(self.mlp.params());
        v
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut v = self.input_layernorm.params_mut();
        v.extend(self.self_attention.params_mut());
        if let Some((n, c)) = &mut self.cross {
            v.extend(n.params_mut());
            v.extend(c.params_mut());
        }
        v.extend(self.pre_mlp_layernorm.params_mut());
        v.extend(self.mlp.params_mut());
        v
    }
}
