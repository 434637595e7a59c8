//! [`MlpLm`]: the `swiglu-mlp-lm` model, forward and backward side by side, every op a
//! [`Backend`] call (so the same code runs on any backend the host provides).
//!
//! ```text
//! x0 = embed(tokens)                                  (N, H)      N = b * s
//! x_{l+1} = x_l + W2_l · swiglu(W1_l · rmsnorm_l(x_l)) (N, H)     l = 0..L
//! logits = W_out · rmsnorm_f(x_L)                      (N, Vp)
//! loss_i = logsumexp(logits_i) - logits_i[label_i]
//! ```
//!
//! Tensor parallel and pipeline sizes must be 1 (the example keeps every parameter whole).

use crate::config::MlpLmConfig;
use crate::init::SplitMix64;
use anyhow::{bail, Context};
use megatron_core::{
    Backend, Batch, DType, DeviceTensor, GemmSpec, HostBuffer, LossReport, Mode, Model, ParallelContext, Param,
    ParamLayout, Result,
};
use std::sync::Arc;

/// What backward needs from one block.
struct BlockCache {
    x: DeviceTensor,      // (N, H) block input
    normed: DeviceTensor, // (N, H)
    rstd: DeviceTensor,   // (N)
    fc1: DeviceTensor,    // (N, 2F)
    act: DeviceTensor,    // (N, F)
}

/// What backward needs from one training microbatch.
struct Cache {
    ids: DeviceTensor,     // (N) i32
    targets: DeviceTensor, // (N) i32
    loss_mask: Vec<f32>,   // (N)
    blocks: Vec<BlockCache>,
    x_last: DeviceTensor,     // (N, H)
    final_norm: DeviceTensor, // (N, H)
    final_rstd: DeviceTensor, // (N)
    logits: DeviceTensor,     // (N, Vp)
    row_max: DeviceTensor,    // (N)
    sum_exp: DeviceTensor,    // (N)
}

pub struct MlpLm {
    config: MlpLmConfig,
    backend: Arc<dyn Backend>,
    vocab: usize,
    /// `[embedding, (norm, fc1, fc2) per layer, final norm, output]`.
    params: Vec<Param>,
    cache: Option<Cache>,
}

// Parameter indices.
const EMBEDDING: usize = 0;
fn block_norm(l: usize) -> usize {
    1 + 3 * l
}
fn block_fc1(l: usize) -> usize {
    2 + 3 * l
}
fn block_fc2(l: usize) -> usize {
    3 + 3 * l
}

impl MlpLm {
    pub fn new(config: MlpLmConfig, backend: Arc<dyn Backend>, ctx: &ParallelContext) -> Result<MlpLm> {
        if ctx.tp_size() != 1 || ctx.pp_size() != 1 {
            bail!(
                "model swiglu-mlp-lm supports tensor and pipeline parallel size 1 only (got tp {}, pp {}); \
                 use --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1",
                ctx.tp_size(),
                ctx.pp_size()
            );
        }
        if config.num_layers == 0 || config.hidden_size == 0 || config.vocab_size == 0 || config.ffn() == 0 {
            bail!("model swiglu-mlp-lm: num_layers, hidden_size, ffn_hidden_size and vocab_size must be > 0");
        }
        let (h, f, v, l) = (config.hidden_size, config.ffn(), config.padded_vocab(), config.num_layers);
        let std = config.init_method_std;
        // Megatron scales the init of layers that write into the residual stream by 1/sqrt(2L).
        let out_std = std / (2.0 * l as f32).sqrt();
        let mut specs: Vec<(String, Vec<usize>, Option<f32>)> =
            vec![("embedding.word_embeddings.weight".into(), vec![v, h], Some(std))];
        for i in 0..l {
            let p = format!("decoder.layers.{i}");
            specs.push((format!("{p}.norm.weight"), vec![h], None));
            specs.push((format!("{p}.mlp.linear_fc1.weight"), vec![2 * f, h], Some(std)));
            specs.push((format!("{p}.mlp.linear_fc2.weight"), vec![h, f], Some(out_std)));
        }
        specs.push(("decoder.final_norm.weight".into(), vec![h], None));
        specs.push(("output_layer.weight".into(), vec![v, h], Some(std)));
        let mut params = Vec::with_capacity(specs.len());
        for (index, (name, shape, init_std)) in specs.into_iter().enumerate() {
            let n: usize = shape.iter().product();
            let values = match init_std {
                Some(s) => SplitMix64::new(config.seed, index as u64).normals(n, s),
                None => vec![1.0; n], // norm weights start at 1
            };
            // Drawn in fp32 and rounded once into the half dtype (the fp32 path is unchanged).
            let mut value = backend.from_host(HostBuffer::F32(values), &shape)?;
            if config.params_dtype != DType::F32 {
                let mut half = backend.zeros(&shape, config.params_dtype)?;
                backend.cast(&value, &mut half)?;
                value = half;
            }
            let grad = backend.zeros(&shape, DType::F32)?;
            let layout = ParamLayout::replicated(&shape, shape.len() == 1);
            params.push(Param { name, value, grad, layout });
        }
        Ok(MlpLm { vocab: v, config, backend, params, cache: None })
    }

    fn final_norm_index(&self) -> usize {
        1 + 3 * self.config.num_layers
    }

    fn output_index(&self) -> usize {
        2 + 3 * self.config.num_layers
    }

    /// Embedding, blocks, final norm and LM head; returns the cache (logits included).
    fn run_forward(&self, tokens: &[i32], targets: Option<&[i32]>) -> Result<(Cache, Vec<BlockCache>)> {
        let be = self.backend.as_ref();
        let (n, h, f, v, eps) =
            (tokens.len(), self.config.hidden_size, self.config.ffn(), self.vocab, self.config.layernorm_epsilon);
        if let Some(bad) = tokens.iter().find(|&&t| t < 0 || t as usize >= self.config.vocab_size) {
            bail!("swiglu-mlp-lm: token id {bad} is outside the vocabulary 0..{}", self.config.vocab_size);
        }
        let dt = self.config.params_dtype; // activations: the parameter dtype
        let ids = be.from_host(HostBuffer::I32(tokens.to_vec()), &[n])?;
        let mut x = be.zeros(&[n, h], dt)?; // (N, H)
        be.embedding_forward(&ids, &self.params[EMBEDDING].value, 0, &mut x, false)?;
        let mut blocks = Vec::with_capacity(self.config.num_layers);
        for l in 0..self.config.num_layers {
            let mut normed = be.zeros(&[n, h], dt)?; // (N, H)
            let mut rstd = be.zeros(&[n], DType::F32)?; // (N)
            be.rmsnorm_forward(&x, &self.params[block_norm(l)].value, eps, &mut normed, &mut rstd)?;
            let mut fc1 = be.zeros(&[n, 2 * f], dt)?; // (N, 2F)
            be.gemm(&normed, &self.params[block_fc1(l)].value, &mut fc1, GemmSpec::linear(n, 2 * f, h), None)?;
            let mut act = be.zeros(&[n, f], dt)?; // (N, F)
            be.swiglu_forward(&fc1, &mut act)?;
            let mut y = be.zeros(&[n, h], dt)?; // (N, H)
            be.gemm(&act, &self.params[block_fc2(l)].value, &mut y, GemmSpec::linear(n, h, f), None)?;
            let mut next = be.zeros(&[n, h], dt)?;
            be.add(&x, &y, &mut next)?;
            blocks.push(BlockCache { x: std::mem::replace(&mut x, next), normed, rstd, fc1, act });
        }
        let mut final_norm = be.zeros(&[n, h], dt)?; // (N, H)
        let mut final_rstd = be.zeros(&[n], DType::F32)?; // (N)
        be.rmsnorm_forward(&x, &self.params[self.final_norm_index()].value, eps, &mut final_norm, &mut final_rstd)?;
        let mut logits = be.zeros(&[n, v], dt)?; // (N, Vp)
        be.gemm(&final_norm, &self.params[self.output_index()].value, &mut logits, GemmSpec::linear(n, v, h), None)?;
        let targets = be.from_host(HostBuffer::I32(targets.unwrap_or(tokens).to_vec()), &[n])?;
        let cache = Cache {
            ids,
            targets,
            loss_mask: Vec::new(),
            blocks: Vec::new(),
            x_last: x,
            final_norm,
            final_rstd,
            logits,
            row_max: be.zeros(&[n], DType::F32)?,
            sum_exp: be.zeros(&[n], DType::F32)?,
        };
        Ok((cache, blocks))
    }
}

impl Model for MlpLm {
    fn name(&self) -> &str {
        crate::MODEL_NAME
    }

    fn forward(&mut self, batch: &Batch, mode: Mode) -> Result<LossReport> {
        if self.config.panic_in_forward {
            panic!("swiglu-mlp-lm: panic_in_forward is set (a deliberate panic to exercise the host's guard)");
        }
        let be = self.backend.clone();
        let n = batch.micro_batch_size * batch.seq_length;
        if batch.tokens.len() != n || batch.labels.len() != n || batch.loss_mask.len() != n {
            bail!("swiglu-mlp-lm: batch arrays must all have micro_batch_size x seq_length = {n} entries");
        }
        let (mut cache, blocks) = self.run_forward(&batch.tokens, Some(&batch.labels))?;
        be.row_max(&cache.logits, &mut cache.row_max)?;
        let mut target_logit = be.zeros(&[n], DType::F32)?; // (N) logit of the label minus row max
        be.cross_entropy_stats(
            &cache.logits,
            &cache.targets,
            0,
            &cache.row_max,
            &mut cache.sum_exp,
            &mut target_logit,
        )?;
        let sum_exp = be.to_host(&cache.sum_exp)?.to_f32_vec();
        let target = be.to_host(&target_logit)?.to_f32_vec();
        let mut report = LossReport::default();
        for i in 0..n {
            let loss = (sum_exp[i] as f64).ln() - target[i] as f64;
            report.loss_sum += loss * batch.loss_mask[i] as f64;
            report.num_tokens += batch.loss_mask[i] as f64;
        }
        if mode == Mode::Train {
            cache.loss_mask = batch.loss_mask.clone();
            cache.blocks = blocks;
            self.cache = Some(cache);
        }
        Ok(report)
    }

    fn backward(&mut self, grad_scale: f32) -> Result<()> {
        let mut c = self.cache.take().context("swiglu-mlp-lm: backward without a training forward")?;
        let be = self.backend.clone();
        let (n, h, f, v) = (c.loss_mask.len(), self.config.hidden_size, self.config.ffn(), self.vocab);
        let dt = self.config.params_dtype; // activation gradients: the parameter dtype
        let d_loss: Vec<f32> = c.loss_mask.iter().map(|m| m * grad_scale).collect();
        let d_loss = be.from_host(HostBuffer::F32(d_loss), &[n])?; // (N)
                                                                   // logits (N, Vp) becomes d_logits in place.
        be.cross_entropy_backward_inplace(&mut c.logits, &c.targets, 0, &c.row_max, &c.sum_exp, &d_loss)?;
        let acc = |m, n, k| GemmSpec { m, n, k, trans_a: true, trans_b: false, alpha: 1.0, beta: 1.0 };
        let plain = |m, n, k| GemmSpec { m, n, k, trans_a: false, trans_b: false, alpha: 1.0, beta: 0.0 };
        // Output layer: dW_out += d_logits^T · final_norm; d_final = d_logits · W_out.
        let (out_index, norm_index) = (self.output_index(), self.final_norm_index());
        let out = &mut self.params[out_index];
        be.gemm(&c.logits, &c.final_norm, &mut out.grad, acc(v, h, n), None)?;
        let mut d_final = be.zeros(&[n, h], dt)?;
        be.gemm(&c.logits, &out.value, &mut d_final, plain(n, h, v), None)?;
        let norm = &mut self.params[norm_index];
        let mut d_x = be.zeros(&[n, h], dt)?; // d loss / d x_l, walking down
        be.rmsnorm_backward(&d_final, &c.x_last, &norm.value, &c.final_rstd, &mut d_x, &mut norm.grad)?;
        for l in (0..self.config.num_layers).rev() {
            let b = &c.blocks[l];
            // fc2: dW2 += d_y^T · act; d_act = d_y · W2 (d_y = d_x through the residual).
            let fc2 = &mut self.params[block_fc2(l)];
            be.gemm(&d_x, &b.act, &mut fc2.grad, acc(h, f, n), None)?;
            let mut d_act = be.zeros(&[n, f], dt)?;
            be.gemm(&d_x, &fc2.value, &mut d_act, plain(n, f, h), None)?;
            let mut d_fc1 = be.zeros(&[n, 2 * f], dt)?;
            be.swiglu_backward(&b.fc1, &d_act, &mut d_fc1)?;
            let fc1 = &mut self.params[block_fc1(l)];
            be.gemm(&d_fc1, &b.normed, &mut fc1.grad, acc(2 * f, h, n), None)?;
            let mut d_normed = be.zeros(&[n, h], dt)?;
            be.gemm(&d_fc1, &fc1.value, &mut d_normed, plain(n, h, 2 * f), None)?;
            let norm = &mut self.params[block_norm(l)];
            let mut d_branch = be.zeros(&[n, h], dt)?;
            be.rmsnorm_backward(&d_normed, &b.x, &norm.value, &b.rstd, &mut d_branch, &mut norm.grad)?;
            be.axpy(&mut d_x, 1.0, &d_branch)?; // residual: d x_l = d x_{l+1} + branch
        }
        be.embedding_backward(&c.ids, &d_x, 0, &mut self.params[EMBEDDING].grad)?;
        Ok(())
    }

    fn logits(&mut self, tokens: &[i32], micro_batch_size: usize, seq_length: usize) -> Result<DeviceTensor> {
        if tokens.len() != micro_batch_size * seq_length {
            bail!("swiglu-mlp-lm: logits got {} tokens for {micro_batch_size} x {seq_length}", tokens.len());
        }
        let (mut cache, _) = self.run_forward(tokens, None)?;
        cache.logits.reshape(&[micro_batch_size, seq_length, self.vocab])?;
        Ok(cache.logits)
    }

    fn params(&self) -> Vec<&Param> {
        self.params.iter().collect()
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        self.params.iter_mut().collect()
    }

    fn zero_grad(&mut self) -> Result<()> {
        for p in &mut self.params {
            self.backend.fill(&mut p.grad, 0.0)?;
        }
        Ok(())
    }

    /// `6 x (matmul parameters) x tokens` (forward 2, backward 4 FLOPs per weight and token).
    fn flops_per_iteration(&self, samples: usize) -> f64 {
        let (h, f, l) = (self.config.hidden_size as f64, self.config.ffn() as f64, self.config.num_layers as f64);
        let matmul_params = l * 3.0 * f * h + self.vocab as f64 * h;
        6.0 * matmul_params * (samples * self.config.seq_length.unwrap_or(0)) as f64
    }
}
