//! [`T5Model`]: Megatron-Core's `T5Model` on one pipeline stage (SPEC §4.9). One embedding
//! module (word + learned positions, or word only with relative positions) embeds both the
//! encoder and the decoder inputs; the encoder stack (padding mask) ends in
//! `encoder.final_layernorm`, the decoder stack (causal self-attention + cross-attention to the
//! encoder output) in `decoder.final_layernorm`; the LM head is the word embedding (tied) with
//! a vocab-parallel bias `lm_head.output_layer.bias`, and the loss is the vocab-parallel cross
//! entropy over the decoder positions with the loss mask (the GPT loss function).
//!
//! Tensor parallelism splits heads, the FFN and the vocabulary as in GPT; pipeline parallelism
//! is refused (as Megatron-Core does for T5).

use crate::attention::{AttnDims, AttnInputs, T5Attention};
use crate::batch::T5Batch;
use crate::config::T5Config;
use crate::host::lengths;
use crate::layer::{norm, T5Layer};
use crate::mlp::T5Mlp;
use crate::recompute::{backward_stack, forward_stack, StackInputs};
use crate::relative::RelativeBias;
use anyhow::{bail, Result};
use megatron_core::{Backend, Batch, DType, DeviceTensor, HostBuffer, LossReport, Mode, Model, ParallelContext, Param};
use megatron_transformer::init::mix64;
use megatron_transformer::tp_mappings::{copy_to_tp_region_backward, copy_to_tp_region_forward};
use megatron_transformer::{
    linear_backward, linear_forward, Init, LanguageModelEmbedding, ModuleBuilder, NormLayer, Split, StepInfo,
    VocabParallelCrossEntropy,
};
use std::sync::Arc;

/// What a training forward keeps for backward besides the modules' own caches.
struct Saved {
    t: T5Batch,
    enc_ids: DeviceTensor,
    dec_ids: DeviceTensor,
    enc_len: DeviceTensor,
    dec_len: DeviceTensor,
    enc_bias: Option<DeviceTensor>, // (heads/tp, S_enc, S_enc)
    dec_bias: Option<DeviceTensor>, // (heads/tp, S_dec, S_dec)
    enc_pre_final: DeviceTensor,    // (B*S_enc, C)
    enc_out: DeviceTensor,          // (B*S_enc, C)
    dec_pre_final: DeviceTensor,    // (B*S_dec, C)
    head_in: DeviceTensor,          // (B*S_dec, C): scaled decoder output
    logits: DeviceTensor,           // (B*S_dec, V/tp)
    targets: DeviceTensor,          // (B*S_dec) int32
    enc_step: StepInfo,
    dec_step: StepInfo,
    /// Full recomputation: the input of every encoder / decoder unit, `(B*S, C)` each.
    enc_units: Vec<DeviceTensor>,
    dec_units: Vec<DeviceTensor>,
}

pub struct T5Model {
    config: T5Config,
    backend: Arc<dyn Backend>,
    ctx: ParallelContext,
    pub embedding: LanguageModelEmbedding,
    pub encoder_relative: Option<RelativeBias>,
    pub decoder_relative: Option<RelativeBias>,
    pub encoder: Vec<T5Layer>,
    pub encoder_final_layernorm: Box<dyn NormLayer>,
    pub decoder: Vec<T5Layer>,
    pub decoder_final_layernorm: Box<dyn NormLayer>,
    /// `lm_head.output_layer.weight` `[V_padded/tp, h]` when untied; else the word embedding.
    pub output_layer: Option<Param>,
    pub lm_head_bias: Option<Param>,
    ce: VocabParallelCrossEntropy,
    saved: Option<Saved>,
}

impl T5Model {
    pub fn new(config: T5Config, backend: Arc<dyn Backend>, ctx: ParallelContext) -> Result<T5Model> {
        if ctx.pp_size() > 1 {
            bail!(
                "t5 does not support pipeline parallelism (--pipeline-model-parallel-size {}), as in Megatron-Core; \
                 use --pipeline-model-parallel-size 1 with tensor and data parallelism",
                ctx.pp_size()
            );
        }
        let tp = ctx.tp_size();
        config.validate(tp)?;
        let b = ModuleBuilder::new(backend.clone(), ctx.clone(), config.seed).with_precision(config.precision()?);
        let (h, std) = (config.hidden_size, config.init_method_std);
        let vocab = config.padded_vocab_size(tp)?;
        let embedding = if config.relative() {
            LanguageModelEmbedding::without_positions(&b, "embedding", vocab, h, std, config.hidden_dropout)?
        } else {
            LanguageModelEmbedding::new(
                &b,
                "embedding",
                vocab,
                config.max_position_embeddings,
                h,
                std,
                config.hidden_dropout,
            )?
        };
        let rel = |prefix: &str, bidirectional: bool| {
            RelativeBias::new(
                &b,
                prefix,
                config.num_attention_heads,
                config.relative_attention_num_buckets,
                config.relative_attention_max_distance,
                bidirectional,
                std,
            )
        };
        let (encoder_relative, decoder_relative) = if config.relative() {
            (Some(rel("encoder_relative_pos_emb", true)?), Some(rel("decoder_relative_pos_emb", false)?))
        } else {
            (None, None)
        };
        let out_std = config.output_init_std(config.encoder_num_layers + config.decoder_num_layers);
        let dims = AttnDims {
            hidden: h,
            heads: config.num_attention_heads,
            head_dim: config.head_dim(),
            bias: config.add_bias_linear,
            scale: config.softmax_scale(),
            dropout: config.attention_dropout,
            init_std: std,
            output_init_std: out_std,
        };
        let eps = config.layernorm_epsilon;
        let kind = config.normalization;
        let layer = |stack: &str, i: usize, decoder: bool| -> Result<T5Layer> {
            let p = format!("{stack}.layers.{i}");
            let id = if decoder { 1000 + i } else { i };
            let cross = if decoder {
                Some((
                    norm(&b, &format!("{p}.pre_cross_attn_layernorm"), kind, h, eps)?,
                    T5Attention::new(&b, &format!("{p}.cross_attention"), dims, true, false, 2000 + i)?,
                ))
            } else {
                None
            };
            Ok(T5Layer::new(
                backend.clone(),
                norm(&b, &format!("{p}.input_layernorm"), kind, h, eps)?,
                T5Attention::new(&b, &format!("{p}.self_attention"), dims, false, decoder, id)?,
                cross,
                norm(&b, &format!("{p}.pre_mlp_layernorm"), kind, h, eps)?,
                T5Mlp::new(
                    &b,
                    &format!("{p}.mlp"),
                    h,
                    config.ffn_hidden_size(),
                    config.activation,
                    config.add_bias_linear,
                    std,
                    out_std,
                )?,
                config.hidden_dropout,
                id,
                config.params_dtype,
            ))
        };
        let encoder = (0..config.encoder_num_layers).map(|i| layer("encoder", i, false)).collect::<Result<Vec<_>>>()?;
        let decoder = (0..config.decoder_num_layers).map(|i| layer("decoder", i, true)).collect::<Result<Vec<_>>>()?;
        let output_layer = if config.untie_embeddings_and_output_weights {
            Some(b.param("lm_head.output_layer.weight", &[vocab, h], Split::Rows { chunks: 1 }, Init::Normal(std))?)
        } else {
            None
        };
        let lm_head_bias = if config.lm_head_bias {
            Some(b.param("lm_head.output_layer.bias", &[vocab], Split::Rows { chunks: 1 }, Init::Zeros)?)
        } else {
            None
        };
        Ok(T5Model {
            encoder_final_layernorm: norm(&b, "encoder.final_layernorm", kind, h, eps)?,
            decoder_final_layernorm: norm(&b, "decoder.final_layernorm", kind, h, eps)?,
            ce: VocabParallelCrossEntropy::new(backend.clone(), ctx.clone())?,
            config,
            backend,
            ctx,
            embedding,
            encoder_relative,
            decoder_relative,
            encoder,
            decoder,
            output_layer,
            lm_head_bias,
            saved: None,
        })
    }

    pub fn config(&self) -> &T5Config {
        &self.config
    }

    pub fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    fn ids(&self, v: &[i32]) -> Result<DeviceTensor> {
        self.backend.from_host(HostBuffer::I32(v.to_vec()), &[v.len()])
    }

    /// Tensor-parallel size of the model's parallel context.
    /// The LM head weight `[V_padded/tp, h]`: the untied output layer or the word embedding.
    pub fn head_weight(&self) -> &DeviceTensor {
        self.output_layer.as_ref().map_or(&self.embedding.word_embeddings.weight.value, |p| &p.value)
    }

    pub fn tp_size(&self) -> usize {
        self.ctx.tp_size()
    }

    /// Embedding, encoder stack and final norm: `(pre-final x, enc_out)`, both `(B*S_enc, C)`.
    fn encoder_pass(
        &mut self,
        enc_ids: &DeviceTensor,
        enc_len: &DeviceTensor,
        enc_bias: Option<&DeviceTensor>,
        step: &StepInfo,
        units: &mut Vec<DeviceTensor>,
    ) -> Result<(DeviceTensor, DeviceTensor)> {
        let be = self.backend.clone();
        let (b, se, h) = (step.batch, step.seq, self.config.hidden_size);
        let mut x = be.zeros(&[b * se, h], self.config.params_dtype)?;
        self.embedding.forward(enc_ids, &mut x, step)?;
        let enc_in = AttnInputs {
            batch: b,
            q_len: se,
            kv_len: se,
            q_valid: Some(enc_len),
            kv_valid: Some(enc_len),
            bias: enc_bias,
        };
        let a = StackInputs { memory: None, self_in: enc_in, cross_in: None };
        x = forward_stack(be.as_ref(), &mut self.encoder, self.config.recompute, x, a, step, units)?;
        let mut enc_out = be.zeros(&[b * se, h], self.config.params_dtype)?;
        self.encoder_final_layernorm.forward(&x, &mut enc_out)?;
        Ok((x, enc_out))
    }

    /// The encoder output `(S, C)` of one unpadded input of `S` tokens (inference: generation
    /// encodes once, see [`crate::decode`]). `S` is free with relative positions and at most
    /// `max_position_embeddings` with learned ones.
    pub fn encode(&mut self, enc_tokens: &[i32]) -> Result<DeviceTensor> {
        let se = enc_tokens.len();
        if se == 0 {
            bail!("t5 encode: the encoder input is empty");
        }
        let step = StepInfo { batch: 1, seq: se, train: false, seed: 0 };
        let ids = self.ids(enc_tokens)?;
        let len = lengths(self.backend.as_ref(), &[se])?;
        let bias = self.encoder_relative.as_ref().map(|r| r.forward(se, se)).transpose()?;
        Ok(self.encoder_pass(&ids, &len, bias.as_ref(), &step, &mut Vec::new())?.1)
    }

    /// Runs encoder and decoder; returns the saved state (with the logits).
    fn run(&mut self, t: T5Batch, seed: u64, train: bool) -> Result<Saved> {
        let be = self.backend.clone();
        let be = be.as_ref();
        let (b, se, sd, h) = (t.batch, t.enc_seq, t.dec_seq, self.config.hidden_size);
        let act = self.config.params_dtype;
        let enc_step = StepInfo { batch: b, seq: se, train, seed };
        let dec_step = StepInfo { batch: b, seq: sd, train, seed: mix64(seed ^ 0x7435_6465_636f_6465) };
        let (enc_ids, dec_ids) = (self.ids(&t.enc_tokens)?, self.ids(&t.dec_tokens)?);
        let (enc_len, dec_len) = (lengths(be, &t.enc_len)?, lengths(be, &t.dec_len)?);
        let enc_bias = self.encoder_relative.as_ref().map(|r| r.forward(se, se)).transpose()?;
        let dec_bias = self.decoder_relative.as_ref().map(|r| r.forward(sd, sd)).transpose()?;
        let mut enc_units = Vec::new();
        let (enc_pre_final, enc_out) =
            self.encoder_pass(&enc_ids, &enc_len, enc_bias.as_ref(), &enc_step, &mut enc_units)?;
        // Decoder.
        let mut y = be.zeros(&[b * sd, h], act)?;
        self.embedding.forward(&dec_ids, &mut y, &dec_step)?;
        let dec_in = AttnInputs {
            batch: b,
            q_len: sd,
            kv_len: sd,
            q_valid: Some(&dec_len),
            kv_valid: Some(&dec_len),
            bias: dec_bias.as_ref(),
        };
        let cross_in = AttnInputs {
            batch: b,
            q_len: sd,
            kv_len: se,
            q_valid: Some(&dec_len),
            kv_valid: Some(&enc_len),
            bias: None,
        };
        let a = StackInputs { memory: Some(&enc_out), self_in: dec_in, cross_in: Some(cross_in) };
        let mut dec_units = Vec::new();
        y = forward_stack(be, &mut self.decoder, self.config.recompute, y, a, &dec_step, &mut dec_units)?;
        let mut head_in = be.zeros(&[b * sd, h], act)?;
        self.decoder_final_layernorm.forward(&y, &mut head_in)?;
        if let Some(s) = self.config.output_scale {
            be.scale(&mut head_in, s)?;
        }
        // LM head (tied unless untied) with bias: logits stay vocab-parallel.
        let w = self.head_weight();
        let mut logits = be.zeros(&[b * sd, w.shape()[0]], DType::F32)?;
        copy_to_tp_region_forward(&self.ctx, &head_in)?;
        linear_forward(be, &head_in, w, self.lm_head_bias.as_ref().map(|p| &p.value), &mut logits)?;
        let targets = self.ids(&t.labels)?;
        Ok(Saved {
            t,
            enc_ids,
            dec_ids,
            enc_len,
            dec_len,
            enc_bias,
            dec_bias,
            enc_pre_final,
            enc_out,
            dec_pre_final: y,
            head_in,
            logits,
            targets,
            enc_step,
            dec_step,
            enc_units,
            dec_units,
        })
    }
}

impl Model for T5Model {
    fn name(&self) -> &str {
        "t5"
    }

    fn forward(&mut self, batch: &Batch, mode: Mode) -> Result<LossReport> {
        let t = T5Batch::unpack(batch, self.config.encoder_seq_length, self.config.decoder_seq_length)?;
        let train = mode == Mode::Train;
        let saved = self.run(t, batch.seed, train)?;
        let vocab_start = self.embedding.word_embeddings.vocab_range().0;
        let losses = self.ce.forward(&saved.logits, &saved.targets, vocab_start)?;
        let mut report = LossReport::default();
        for (l, &m) in losses.iter().zip(&saved.t.loss_mask) {
            report.loss_sum += l * m as f64;
            report.num_tokens += m as f64;
        }
        self.saved = if train { Some(saved) } else { None };
        Ok(report)
    }

    fn backward(&mut self, grad_scale: f32) -> Result<()> {
        let Some(mut s) = self.saved.take() else { bail!("t5 backward called without a training forward") };
        let be = self.backend.clone();
        let be = be.as_ref();
        let (b, se, sd) = (s.t.batch, s.t.enc_seq, s.t.dec_seq);
        let act = self.config.params_dtype;
        let d_loss: Vec<f32> = s.t.loss_mask.iter().map(|&m| m * grad_scale).collect();
        let d_loss = be.from_host(HostBuffer::F32(d_loss), &[b * sd])?;
        let vocab_start = self.embedding.word_embeddings.vocab_range().0;
        self.ce.backward_inplace(&mut s.logits, &s.targets, vocab_start, &d_loss)?;
        let mut d_head = be.zeros(s.head_in.shape(), act)?;
        {
            let w = match self.output_layer.as_mut() {
                Some(p) => p,
                None => &mut self.embedding.word_embeddings.weight,
            };
            let d_b = self.lm_head_bias.as_mut().map(|p| &mut p.grad);
            linear_backward(be, &s.head_in, &w.value, &s.logits, Some(&mut d_head), &mut w.grad, d_b)?;
        }
        copy_to_tp_region_backward(&self.ctx, &mut d_head)?;
        if let Some(sc) = self.config.output_scale {
            be.scale(&mut d_head, sc)?;
        }
        let mut d_y = be.zeros(d_head.shape(), act)?;
        self.decoder_final_layernorm.backward(&d_head, &s.dec_pre_final, &mut d_y)?;
        // Decoder stack, then its embedding.
        let mut d_memory = be.zeros(s.enc_out.shape(), act)?;
        let mut d_dec_bias = s.dec_bias.as_ref().map(|t| be.zeros(t.shape(), DType::F32)).transpose()?;
        let dec_in = AttnInputs {
            batch: b,
            q_len: sd,
            kv_len: sd,
            q_valid: Some(&s.dec_len),
            kv_valid: Some(&s.dec_len),
            bias: s.dec_bias.as_ref(),
        };
        let cross_in = AttnInputs {
            batch: b,
            q_len: sd,
            kv_len: se,
            q_valid: Some(&s.dec_len),
            kv_valid: Some(&s.enc_len),
            bias: None,
        };
        let a = StackInputs { memory: Some(&s.enc_out), self_in: dec_in, cross_in: Some(cross_in) };
        d_y = backward_stack(
            be,
            &mut self.decoder,
            self.config.recompute,
            d_y,
            a,
            Some(&mut d_memory),
            d_dec_bias.as_mut(),
            &s.dec_step,
            &s.dec_units,
        )?;
        if let (Some(r), Some(d)) = (self.decoder_relative.as_mut(), d_dec_bias.as_ref()) {
            r.backward(d, sd, sd)?;
        }
        self.embedding.backward(&s.dec_ids, &d_y, &s.dec_step)?;
        // Encoder stack, then its embedding.
        let mut d_x = be.zeros(d_memory.shape(), act)?;
        self.encoder_final_layernorm.backward(&d_memory, &s.enc_pre_final, &mut d_x)?;
        let mut d_enc_bias = s.enc_bias.as_ref().map(|t| be.zeros(t.shape(), DType::F32)).transpose()?;
        let enc_in = AttnInputs {
            batch: b,
            q_len: se,
            kv_len: se,
            q_valid: Some(&s.enc_len),
            kv_valid: Some(&s.enc_len),
            bias: s.enc_bias.as_ref(),
        };
        let a = StackInputs { memory: None, self_in: enc_in, cross_in: None };
        let rc = self.config.recompute;
        d_x = backward_stack(be, &mut self.encoder, rc, d_x, a, None, d_enc_bias.as_mut(), &s.enc_step, &s.enc_units)?;
        if let (Some(r), Some(d)) = (self.encoder_relative.as_mut(), d_enc_bias.as_ref()) {
            r.backward(d, se, se)?;
        }
        self.embedding.backward(&s.enc_ids, &d_x, &s.enc_step)
    }

    fn logits(&mut self, tokens: &[i32], micro_batch_size: usize, seq_length: usize) -> Result<DeviceTensor> {
        let (se, sd) = (self.config.encoder_seq_length, self.config.decoder_seq_length);
        if seq_length != se + sd {
            bail!("t5 logits: rows of {seq_length} tokens, expected encoder {se} + decoder {sd}");
        }
        let t = T5Batch::unpadded(tokens, micro_batch_size, se, sd)?;
        Ok(self.run(t, 0, false)?.logits)
    }

    fn params(&self) -> Vec<&Param> {
        let mut v = self.embedding.params();
        v.extend(self.encoder_relative.iter().map(|r| &r.weight));
        v.extend(self.decoder_relative.iter().map(|r| &r.weight));
        for l in &self.encoder {
            v.extend(l.params());
        }
        v.extend(self.encoder_final_layernorm.params());
        for l in &self.decoder {
            v.extend(l.params());
        }
        v.extend(self.decoder_final_layernorm.params());
        v.extend(self.output_layer.iter());
        v.extend(self.lm_head_bias.iter());
        v
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut v = self.embedding.params_mut();
        v.extend(self.encoder_relative.iter_mut().map(|r| &mut r.weight));
        v.extend(self.decoder_relative.iter_mut().map(|r| &mut r.weight));
        for l in &mut self.encoder {
            v.extend(l.params_mut());
        }
        v.extend(self.encoder_final_layernorm.params_mut());
        for l in &mut self.decoder {
            v.extend(l.params_mut());
        }
        v.extend(self.decoder_final_layernorm.params_mut());
        v.extend(self.output_layer.iter_mut());
        v.extend(self.lm_head_bias.iter_mut());
        v
    }

    fn zero_grad(&mut self) -> Result<()> {
        let be = self.backend.clone();
        megatron_transformer::step::zero_grads(be.as_ref(), self.params_mut())
    }

    /// `6·params·tokens`-style count (SPEC §6.13 adapted): per sample, the matmuls of every
    /// encoder layer over `S_enc` tokens and decoder layer over `S_dec` (cross-attention's
    /// K/V over `S_enc`), the attention scores, and the LM head, times 3 for backward.
    fn flops_per_iteration(&self, samples: usize) -> f64 {
        let c = &self.config;
        let (h, f) = (c.hidden_size as f64, c.ffn_hidden_size() as f64);
        let a = (c.num_attention_heads * c.head_dim()) as f64;
        let (se, sd) = (c.encoder_seq_length as f64, c.decoder_seq_length as f64);
        let gates = if c.activation == crate::config::T5Activation::GatedGelu { 3.0 } else { 2.0 };
        let mlp = 2.0 * gates * h * f;
        let enc = c.encoder_num_layers as f64 * se * (2.0 * 4.0 * h * a + mlp + 4.0 * se * a);
        let dec = c.decoder_num_layers as f64
            * (sd * (2.0 * 4.0 * h * a + 2.0 * 2.0 * h * a + mlp + 4.0 * sd * a + 4.0 * se * a)
                + se * 2.0 * 2.0 * h * a);
        let v = c.padded_vocab_size(self.ctx.tp_size()).unwrap_or(c.vocab_size) as f64;
        let head = 2.0 * sd * h * v;
        3.0 * samples as f64 * (enc + dec + head)
    }
}
