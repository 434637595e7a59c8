//! Helpers shared by the t5 integration tests: tiny configs and a padded packed batch.
#![allow(dead_code)]

use megatron_core::{Backend, Batch, ParallelContext};
use megatron_cpu::CpuBackend;
use megatron_t5::{pack_sample, T5Activation, T5Config, T5Model};
use megatron_transformer::NormKind;
use std::sync::Arc;

pub const VOCAB: usize = 40;
pub const SE: usize = 7;
pub const SD: usize = 5;

pub fn config() -> T5Config {
    let mut c = T5Config::new(2, 16, 2, SE, SD, VOCAB);
    c.decoder_num_layers = 1;
    c.hidden_dropout = 0.0;
    c.attention_dropout = 0.0;
    c.init_method_std = 0.3;
    c.make_vocab_size_divisible_by = 1;
    c.ffn_hidden_size = Some(24);
    c.seed = 5;
    c
}

pub fn hf_style() -> T5Config {
    let mut c = config();
    c.position_embedding_type = "relative".into();
    c.relative_attention_num_buckets = 8;
    c.relative_attention_max_distance = 10;
    c.normalization = NormKind::RMSNorm;
    c.activation = T5Activation::GatedGelu;
    c.add_bias_linear = false;
    c.lm_head_bias = false;
    c.softmax_scale = Some(1.0);
    c.output_scale = Some(0.25);
    c
}

pub fn model(c: T5Config) -> T5Model {
    model_in(c, ParallelContext::single())
}

pub fn model_in(c: T5Config, ctx: ParallelContext) -> T5Model {
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    T5Model::new(c, be, ctx).unwrap()
}

/// Two samples: row 0 without padding, row 1 with 4 encoder and 3 decoder tokens.
/// `pad_token` fills the padded positions (padding invariance changes it).
pub fn batch(pad_token: i32) -> Batch {
    let mut b =
        Batch { micro_batch_size: 2, seq_length: SE + SD, tokens: vec![], labels: vec![], loss_mask: vec![], seed: 9 };
    for (r, (el, dl)) in [(SE, SD), (4, 3)].into_iter().enumerate() {
        let tok = |i: usize, shift: usize, valid: usize| {
            if i < valid {
                ((i * 7 + r * 3 + shift) % VOCAB) as i32
            } else {
                pad_token
            }
        };
        let enc: Vec<i32> = (0..SE).map(|i| tok(i, 1, el)).collect();
        let dec: Vec<i32> = (0..SD).map(|i| tok(i, 12, dl)).collect();
        let labels: Vec<i32> = (0..SD).map(|i| if i < dl { ((i * 5 + r + 2) % VOCAB) as i32 } else { -1 }).collect();
        let lm: Vec<f32> = (0..SD).map(|i| if i < dl { 1.0 } else { 0.0 }).collect();
        let em: Vec<f32> = (0..SE).map(|i| if i < el { 1.0 } else { 0.0 }).collect();
        let s = pack_sample(&enc, &dec, &labels, &lm, &em);
        b.tokens.extend(s.tokens);
        b.labels.extend(s.labels);
        b.loss_mask.extend(s.loss_mask);
    }
    b
}
