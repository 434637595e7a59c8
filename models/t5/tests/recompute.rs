//! Full activation recomputation of T5 (SPEC §6.9): with dropout on, for uniform units of 1
//! and 2 layers and block 2, in fp32 and bf16, for both test configs, two accumulated
//! microbatches give bit-identical losses and gradients to the run that keeps every activation.

mod common;

use common::{batch, hf_style};
use megatron_core::{DType, Mode, Model};
use megatron_t5::T5Config;
use megatron_transformer::{FullRecompute, RecomputeMethod};

/// Losses of two microbatches (different dropout seeds) and the accumulated gradients.
fn run(c: T5Config) -> (Vec<u64>, Vec<u32>) {
    let mut m = common::model(c);
    let be = m.backend();
    m.zero_grad().unwrap();
    let mut losses = Vec::new();
    for seed in [9, 10] {
        let mut b = batch(0);
        b.seed = seed;
        let r = m.forward(&b, Mode::Train).unwrap();
        m.backward(1.0 / r.num_tokens as f32).unwrap();
        losses.push(r.loss_sum.to_bits());
    }
    let g = m.params().iter().flat_map(|p| be.to_host(&p.grad).unwrap().to_f32_vec()).map(f32::to_bits).collect();
    (losses, g)
}

fn with(base: &T5Config, dtype: DType, rc: Option<FullRecompute>) -> T5Config {
    let mut c = base.clone();
    c.encoder_num_layers = 3;
    c.decoder_num_layers = 2;
    c.hidden_dropout = 0.1;
    c.attention_dropout = 0.1;
    c.params_dtype = dtype;
    c.recompute = rc;
    c
}

#[test]
fn full_recompute_is_bit_identical() {
    let methods = [(RecomputeMethod::Uniform, 1), (RecomputeMethod::Uniform, 2), (RecomputeMethod::Block, 2)];
    for (what, base) in [("megatron-style", common::config()), ("hf-style", hf_style())] {
        for dtype in [DType::F32, DType::BF16] {
            let (l0, g0) = run(with(&base, dtype, None));
            assert!(g0.iter().any(|&b| b != 0), "{what} {dtype}: no gradients");
            for (method, num_layers) in methods {
                let rc = FullRecompute { method, num_layers };
                let (l, g) = run(with(&base, dtype, Some(rc)));
                assert_eq!(l, l0, "{what} {dtype} {rc:?}: losses differ");
                assert!(g == g0, "{what} {dtype} {rc:?}: gradients differ");
            }
        }
    }
}
