//! BERT's heads (SPEC §4.8): the LM head (`lm_head.dense` → GeLU → `lm_head.layer_norm` → the
//! output projection tied to the word embedding plus `output_layer.bias`, vocab-parallel) and
//! the binary (sentence-order) head on the pooled first token (`pooler.dense` → tanh →
//! `binary_head`). The dense/norm/pooler/binary parameters are replicated over TP (plain
//! `nn.Linear`s in Megatron); only the logits and `output_layer.bias` are vocab-split.
//!
//! The pooler and binary head act on `B` rows only, so their tanh and 2-way softmax run on the
//! host; their matmuls go through the backend.

use anyhow::Result;
use megatron_core::{Backend, DeviceTensor, HostBuffer, Param};
use megatron_transformer::linear::{linear_backward, linear_forward};
use megatron_transformer::{Init, ModuleBuilder, Split};

/// `pooler.dense` and `binary_head`: `logits (B, 2) = W_b tanh(W_p h_cls + b_p) + b_b`.
pub struct BinaryHead {
    pub pooler_weight: Param, // (C, C)
    pub pooler_bias: Param,   // (C)
    pub weight: Param,        // (classes, C): 2 for the binary head
    pub bias: Param,          // (classes)
    cls: DeviceTensor,        // (B, C): the first token's hidden state of every row
    pooled: DeviceTensor,     // (B, C): tanh output (after dropout, if any): the head's input
    tanh: Vec<f32>,           // (B, C): tanh output before dropout (host)
    keep: Option<Vec<f32>>,   // (B, C): dropout scale, 0 or 1/(1-p) (host); None without dropout
}

impl BinaryHead {
    pub fn new(b: &ModuleBuilder, hidden: usize, std: f32) -> Result<BinaryHead> {
        BinaryHead::with_classes(b, hidden, std, 2, "binary_head")
    }

    /// The pooler and a `classes`-way linear named `{head}.weight` / `{head}.bias` (the
    /// finetuning classification head of Megatron's `Classification` model).
    pub fn with_classes(b: &ModuleBuilder, hidden: usize, std: f32, classes: usize, head: &str) -> Result<BinaryHead> {
        let bk = b.backend.as_ref();
        let (w, bias) = (format!("{head}.weight"), format!("{head}.bias"));
        Ok(BinaryHead {
            pooler_weight: b.param("pooler.dense.weight", &[hidden, hidden], Split::Replicated, Init::Normal(std))?,
            pooler_bias: b.param("pooler.dense.bias", &[hidden], Split::Replicated, Init::Zeros)?,
            weight: b.param(&w, &[classes, hidden], Split::Replicated, Init::Normal(std))?,
            bias: b.param(&bias, &[classes], Split::Replicated, Init::Zeros)?,
            cls: bk.zeros(&[0], megatron_core::DType::F32)?,
            pooled: bk.zeros(&[0], megatron_core::DType::F32)?,
            tanh: Vec::new(),
            keep: None,
        })
    }

    /// The `(B, classes)` logits from `hidden (B, T, C)` (host values), keeping what backward needs.
    pub fn forward(&mut self, bk: &dyn Backend, hidden: &[f32], batch: usize, seq: usize) -> Result<Vec<f32>> {
        self.forward_with_dropout(bk, hidden, batch, seq, None)
    }

    /// [`Self::forward`] with dropout `(p, seed)` on the pooled output before the last linear
    /// (Megatron's `Classification` model applies `hidden_dropout` there during training).
    pub fn forward_with_dropout(
        &mut self,
        bk: &dyn Backend,
        hidden: &[f32],
        batch: usize,
        seq: usize,
        dropout: Option<(f32, u64)>,
    ) -> Result<Vec<f32>> {
        let c = hidden.len() / (batch * seq).max(1);
        let cls: Vec<f32> = (0..batch).flat_map(|r| hidden[r * seq * c..r * seq * c + c].iter().copied()).collect();
        self.cls = bk.from_host(HostBuffer::F32(cls), &[batch, c])?;
        let mut pre = bk.zeros(&[batch, c], megatron_core::DType::F32)?;
        linear_forward(bk, &self.cls, &self.pooler_weight.value, Some(&self.pooler_bias.value), &mut pre)?;
        self.tanh = bk.to_host(&pre)?.to_f32_vec().iter().map(|v| v.tanh()).collect();
        self.keep = dropout.filter(|&(p, _)| p > 0.0).map(|(p, seed)| dropout_scales(self.tanh.len(), p, seed));
        let pooled = match &self.keep {
            Some(keep) => self.tanh.iter().zip(keep).map(|(y, k)| y * k).collect(),
            None => self.tanh.clone(),
        };
        self.pooled = bk.from_host(HostBuffer::F32(pooled), &[batch, c])?;
        let classes = self.bias.value.numel();
        let mut logits = bk.zeros(&[batch, classes], megatron_core::DType::F32)?;
        linear_forward(bk, &self.pooled, &self.weight.value, Some(&self.bias.value), &mut logits)?;
        Ok(bk.to_host(&logits)?.to_f32_vec())
    }

    /// From `d_logits (B, classes)`: accumulates the head's gradients and returns `dL/dh_cls (B, C)`.
    pub fn backward(&mut self, bk: &dyn Backend, d_logits: Vec<f32>) -> Result<Vec<f32>> {
        let shape = self.pooled.shape().to_vec();
        let d_logits = bk.from_host(HostBuffer::F32(d_logits), &[shape[0], self.bias.value.numel()])?;
        let mut d_pooled = bk.zeros(&shape, megatron_core::DType::F32)?;
        linear_backward(
            bk,
            &self.pooled,
            &self.weight.value,
            &d_logits,
            Some(&mut d_pooled),
            &mut self.weight.grad,
            Some(&mut self.bias.grad),
        )?;
        // Through the dropout scale, then tanh' = 1 - tanh².
        let mut d_tanh = bk.to_host(&d_pooled)?.to_f32_vec();
        if let Some(keep) = &self.keep {
            d_tanh.iter_mut().zip(keep).for_each(|(g, k)| *g *= k);
        }
        let d_pre: Vec<f32> = d_tanh.iter().zip(&self.tanh).map(|(g, y)| g * (1.0 - y * y)).collect();
        let d_pre = bk.from_host(HostBuffer::F32(d_pre), &shape)?;
        let mut d_cls = bk.zeros(&shape, megatron_core::DType::F32)?;
        let (w, g, bg) = (&self.pooler_weight.value, &mut self.pooler_weight.grad, &mut self.pooler_bias.grad);
        linear_backward(bk, &self.cls, w, &d_pre, Some(&mut d_cls), g, Some(bg))?;
        Ok(bk.to_host(&d_cls)?.to_f32_vec())
    }

    pub fn params(&self) -> Vec<&Param> {
        vec![&self.pooler_weight, &self.pooler_bias, &self.weight, &self.bias]
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        vec![&mut self.pooler_weight, &mut self.pooler_bias, &mut self.weight, &mut self.bias]
    }
}

/// `n` dropout scales (0 with probability `p`, else `1/(1-p)`) drawn from `seed` alone:
/// element `i` uses splitmix64 of `seed + i`, so the mask does not depend on threads.
fn dropout_scales(n: usize, p: f32, seed: u64) -> Vec<f32> {
    let scale = 1.0 / (1.0 - p);
    (0..n as u64)
        .map(|i| {
            let mut z = seed.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let u = (z >> 40) as f32 / (1u64 << 24) as f32; // uniform in [0, 1)
            if u < p {
                0.0
            } else {
                scale
            }
        })
        .collect()
}

/// Per-row cross entropy of `(B, 2)` logits against `is_random` (−1 = ignored, Megatron's
/// `ignore_index=-1`): `(Σ loss, count, d Σloss / d logits)`.
pub fn sop_cross_entropy(logits: &[f32], targets: &[i32]) -> (f64, f64, Vec<f32>) {
    let (mut sum, mut count) = (0.0f64, 0.0f64);
    let mut d = vec![0.0f32; logits.len()];
    for (r, &t) in targets.iter().enumerate() {
        if t < 0 {
            continue;
        }
        let (a, b) = (logits[2 * r] as f64, logits[2 * r + 1] as f64);
        let m = a.max(b);
        let lse = m + ((a - m).exp() + (b - m).exp()).ln();
        let z = if t == 0 { a } else { b };
        sum += lse - z;
        count += 1.0;
        for k in 0..2 {
            let p = ((if k == 0 { a } else { b }) - lse).exp();
            d[2 * r + k] = (p - if k as i32 == t { 1.0 } else { 0.0 }) as f32;
        }
    }
    (sum, count, d)
}

/// Per-row cross entropy of `(B, classes)` logits against `targets` (−1 = ignored):
/// `(Σ loss, count, d Σloss / d logits)`; [`sop_cross_entropy`] is the 2-class case.
pub fn class_cross_entropy(logits: &[f32], targets: &[i32], classes: usize) -> (f64, f64, Vec<f32>) {
    let (mut sum, mut count) = (0.0f64, 0.0f64);
    let mut d = vec![0.0f32; logits.len()];
    for (r, &t) in targets.iter().enumerate() {
        if t < 0 {
            continue;
        }
        let row = &logits[r * classes..(r + 1) * classes];
        let m = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
        let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
        sum += lse - row[t as usize] as f64;
        count += 1.0;
        for (k, &x) in row.iter().enumerate() {
            let p = (x as f64 - lse).exp();
            d[r * classes + k] = (p - if k as i32 == t { 1.0 } else { 0.0 }) as f32;
        }
    }
    (sum, count, d)
}
