//! The whole pre-norm transformer layer against finite differences (with dropout on: the
//! backward must re-apply the forward's masks), plus dropout determinism and eval mode.

mod common;

use common::*;
use megatron_core::{DeviceTensor, Param};
use megatron_transformer::grad_check::{check_params, spread_indices, worst};
use megatron_transformer::{
    gpt_layer_local_spec, BackwardScratch, LocalSpecProvider, ModuleBuilder, NormKind, RotaryConfig, StepInfo,
    TransformerConfig, TransformerLayer,
};

const B: usize = 2;
const T: usize = 3;
const C: usize = 8;

fn config(dropout: f32) -> TransformerConfig {
    TransformerConfig {
        num_layers: 2,
        hidden_size: C,
        num_attention_heads: 2,
        ffn_hidden_size: 12,
        layernorm_epsilon: 1e-5,
        hidden_dropout: dropout,
        attention_dropout: dropout,
        // Large enough that attention and GeLU are far from linear.
        init_method_std: 0.4,
        ..Default::default()
    }
}

/// A Llama-style layer: RoPE (half of each head rotated, base 100), GQA 4 heads / 2 groups,
/// head size 6 (`--kv-channels`, so 4·6 ≠ C), RMSNorm, SwiGLU, no biases but a qkv bias.
fn llama_layer(b: &ModuleBuilder, dropout: f32, interleaved: bool) -> TransformerLayer {
    let cfg = TransformerConfig {
        num_attention_heads: 4,
        num_query_groups: Some(2),
        kv_channels: Some(6),
        rotary: Some(RotaryConfig { base: 100.0, percent: 2.0 / 3.0, interleaved, scaling: Default::default() }),
        ..config(dropout)
    };
    cfg.validate(1).unwrap();
    let mut spec = gpt_layer_local_spec(NormKind::RMSNorm, true, false);
    spec.self_attention.qkv_bias = true;
    TransformerLayer::new(b, &LocalSpecProvider, "decoder.layers.1", &cfg, &spec, 1).unwrap()
}

fn layer(b: &ModuleBuilder, dropout: f32, norm: NormKind, swiglu: bool) -> TransformerLayer {
    let spec = gpt_layer_local_spec(norm, swiglu, true);
    TransformerLayer::new(b, &LocalSpecProvider, "decoder.layers.1", &config(dropout), &spec, 1).unwrap()
}

fn run(l: &mut TransformerLayer, x: &DeviceTensor, step: &StepInfo) -> Vec<f32> {
    let b = backend();
    let mut y = zeros(b.as_ref(), &[B, T, C]);
    l.forward(x, &mut y, step).unwrap();
    host(b.as_ref(), &y)
}

fn check_layer(dropout: f32, norm: NormKind, swiglu: bool) {
    let b = builder(42);
    let l = layer(&b, dropout, norm, swiglu);
    check_built_layer(l, &format!("dropout {dropout}, {norm:?}, swiglu {swiglu}"));
}

fn check_built_layer(mut l: TransformerLayer, what: &str) {
    let bk = backend();
    let bk = bk.as_ref();
    // Non-zero biases so every bias path is exercised with realistic values.
    for p in l.params_mut() {
        if p.name.ends_with("bias") {
            let n = p.value.numel();
            p.value = tensor(bk, random_vec(n, p.name.len() as u64, 0.3), &[n]);
        }
    }
    let step = StepInfo { batch: B, seq: T, train: true, seed: 77 };
    let xv = random_vec(B * T * C, 5, 1.0);
    let r = random_vec(B * T * C, 6, 1.0);
    let x = tensor(bk, xv.clone(), &[B, T, C]);
    let mut y = zeros(bk, &[B, T, C]);
    l.forward(&x, &mut y, &step).unwrap();
    let mut d = tensor(bk, r.clone(), &[B, T, C]);
    let mut scratch = BackwardScratch::new(bk).unwrap();
    l.backward(&x, &mut d, &mut scratch, &step).unwrap();

    fn params(m: &mut TransformerLayer) -> Vec<&mut Param> {
        m.params_mut()
    }
    let mut loss = |m: &mut TransformerLayer| Ok(probe(bk, &tensor(bk, run(m, &x, &step), &[B, T, C]), &r));
    let n_params = l.params().len();
    let samples = check_params(&mut l, bk, params, &|_| true, &mut loss, 4, 1e-2, 1e-2).unwrap();
    let w = worst(&samples).unwrap();
    assert!(w.rel_err < 2e-2, "worst layer parameter gradient ({what}): {w:?}");
    assert!(samples.len() >= 4 * n_params);

    let idx = spread_indices(xv.len(), 12);
    let numeric = fd_input(&xv, &idx, 1e-2, |v| {
        let out = run(&mut l, &tensor(bk, v.to_vec(), &[B, T, C]), &step);
        out.iter().zip(&r).map(|(&o, &r)| o as f64 * r as f64).sum()
    });
    let dx = host(bk, &d);
    let analytic: Vec<f64> = idx.iter().map(|&i| dx[i] as f64).collect();
    assert_close("layer d_x", &analytic, &numeric, 2e-2, 1e-2);
}

#[test]
fn layer_backward_matches_finite_differences_without_dropout() {
    check_layer(0.0, NormKind::LayerNorm, false);
}

#[test]
fn layer_backward_matches_finite_differences_with_dropout() {
    check_layer(0.3, NormKind::LayerNorm, false);
}

#[test]
fn swiglu_rmsnorm_layer_backward_matches_finite_differences() {
    check_layer(0.0, NormKind::RMSNorm, true);
}

#[test]
fn llama_layer_with_rope_gqa_and_qkv_bias_matches_finite_differences() {
    check_built_layer(llama_layer(&builder(42), 0.0, false), "llama, rope halves");
    check_built_layer(llama_layer(&builder(43), 0.2, true), "llama, rope interleaved, dropout");
}

/// `--qk-layernorm` (LayerNorm with bias, and RMSNorm) of the GQA layer's q and k before a
/// rotation with Llama-3.1 scaled frequencies (original context 32: the three wavelengths 6.3, 29
/// and 136 fall in the kept, smoothed and divided bands).
#[test]
fn qk_layernorm_layer_with_scaled_rope_matches_finite_differences() {
    for (seed, kind) in [(44, NormKind::LayerNorm), (45, NormKind::RMSNorm)] {
        let b = builder(seed);
        let cfg = TransformerConfig {
            num_attention_heads: 4,
            num_query_groups: Some(2),
            kv_channels: Some(6),
            rotary: Some(RotaryConfig {
                base: 100.0,
                percent: 1.0,
                interleaved: false,
                scaling: megatron_core::RopeScaling::Llama3 {
                    factor: 4.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 32,
                },
            }),
            qk_layernorm: Some(kind),
            ..config(0.0)
        };
        cfg.validate(1).unwrap();
        let spec = gpt_layer_local_spec(NormKind::RMSNorm, true, false);
        let mut l = TransformerLayer::new(&b, &LocalSpecProvider, "decoder.layers.1", &cfg, &spec, 1).unwrap();
        // Non-trivial norm weights (they start at ones).
        let bk = backend();
        for p in l.params_mut() {
            if p.name.contains("q_layernorm.weight") || p.name.contains("k_layernorm.weight") {
                let n = p.value.numel();
                let w: Vec<f32> = random_vec(n, n as u64 + 3, 0.5).iter().map(|v| 1.0 + v).collect();
                p.value = tensor(bk.as_ref(), w, &[n]);
            }
        }
        let names: Vec<String> = l.params().iter().map(|p| p.name.clone()).collect();
        assert!(names.contains(&"decoder.layers.1.self_attention.k_layernorm.weight".to_string()), "{names:?}");
        check_built_layer(l, &format!("qk {kind:?}, scaled rope"));
    }
}

#[test]
fn dropout_is_a_function_of_the_seed_and_off_in_eval() {
    let bk = backend();
    let x = tensor(bk.as_ref(), random_vec(B * T * C, 3, 1.0), &[B, T, C]);
    let mut with = layer(&builder(9), 0.5, NormKind::LayerNorm, false);
    let mut without = layer(&builder(9), 0.0, NormKind::LayerNorm, false);
    let train = StepInfo { batch: B, seq: T, train: true, seed: 1 };
    let a = run(&mut with, &x, &train);
    let b = run(&mut with, &x, &train);
    assert_eq!(a, b, "same seed must give the same masks");
    let c = run(&mut with, &x, &StepInfo { seed: 2, ..train });
    assert_ne!(a, c, "another seed must give other masks");
    let eval = StepInfo { train: false, ..train };
    let e = run(&mut with, &x, &eval);
    let plain = run(&mut without, &x, &train);
    assert_eq!(e, plain, "eval mode must not drop anything");
    assert_ne!(a, e, "dropout 0.5 in training must change the output");
}
