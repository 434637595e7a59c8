//! Helpers shared by the gpt integration tests.

#![allow(dead_code)]

use megatron_core::{Backend, Batch, ParallelContext};
use megatron_cpu::CpuBackend;
use megatron_gpt::{GptConfig, GptModel};
use std::path::PathBuf;
use std::sync::Arc;

pub fn backend() -> Arc<dyn Backend> {
    Arc::new(CpuBackend::new())
}

/// `shared/data/<name>` found by walking up from this crate (the workspace sits next to
/// `shared/`); `None` when absent, so tests can skip.
pub fn shared_data(name: &str) -> Option<PathBuf> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.ancestors().map(|a| a.join("shared").join("data").join(name)).find(|p| p.exists())
}

/// A tiny GPT with dropout off and a large init std, so every gradient is well above the
/// finite-difference noise.
pub fn tiny_config(vocab: usize, seq: usize) -> GptConfig {
    let mut c = GptConfig::new(2, 16, 2, seq, vocab);
    c.hidden_dropout = 0.0;
    c.attention_dropout = 0.0;
    c.init_method_std = 0.3;
    c.make_vocab_size_divisible_by = 1;
    c.seed = 11;
    c
}

/// A tiny Llama-style GPT: RoPE, 4 heads in 2 query groups, RMSNorm, SwiGLU, no linear
/// biases, untied output layer (the [`tiny_config`] sizes otherwise).
pub fn tiny_llama_config(vocab: usize, seq: usize) -> GptConfig {
    let mut c = tiny_config(vocab, seq);
    c.num_attention_heads = 4;
    c.num_query_groups = Some(2);
    c.position_embedding_type = "rope".into();
    c.rotary_base = 500.0;
    c.normalization = megatron_transformer::NormKind::RMSNorm;
    c.swiglu = true;
    c.ffn_hidden_size = Some(24);
    c.add_bias_linear = false;
    c.untie_embeddings_and_output_weights = true;
    c
}

pub fn tiny_model(c: GptConfig) -> GptModel {
    GptModel::new(c, backend(), ParallelContext::single()).unwrap()
}

/// A deterministic batch: tokens from an LCG, labels shifted by one, the last position of
/// every sequence masked out.
pub fn batch(b: usize, s: usize, vocab: usize, seed: u64) -> Batch {
    let mut x = seed.wrapping_add(17);
    let stream: Vec<i32> = (0..b * (s + 1))
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 33) % vocab as u64) as i32
        })
        .collect();
    let mut tokens = Vec::new();
    let mut labels = Vec::new();
    for r in 0..b {
        let seq = &stream[r * (s + 1)..(r + 1) * (s + 1)];
        tokens.extend_from_slice(&seq[..s]);
        labels.extend_from_slice(&seq[1..]);
    }
    let loss_mask = (0..b * s).map(|i| if i % s == s - 1 { 0.0 } else { 1.0 }).collect();
    Batch { micro_batch_size: b, seq_length: s, tokens, labels, loss_mask, seed }
}

/// `n` values in [-1.5, 1.5) from an LCG whose state starts at `state`.
pub fn lcg_values(n: usize, state: u64) -> Vec<f32> {
    let mut s = state;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * 1.5
        })
        .collect()
}

/// Rows `(b, t)` of a `(B, T, width)` tensor at positions `pos`, as `(B, pos.len(), width)`.
pub fn rows(x: &[f32], b: usize, t: usize, width: usize, pos: &[usize]) -> Vec<f32> {
    (0..b)
        .flat_map(|r| pos.iter().flat_map(move |&p| x[(r * t + p) * width..(r * t + p + 1) * width].to_vec()))
        .collect()
}

/// Largest `|a - b|` over the largest `|b|` (at least 1e-6).
pub fn max_abs_rel(a: &[f32], b: &[f32]) -> f32 {
    let max = b.iter().fold(1e-6f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / max
}
