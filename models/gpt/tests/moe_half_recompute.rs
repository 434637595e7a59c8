//! MoE layers (the `mlp` plugin, `megatron-moe`, linked in) in half-precision models and under
//! full recomputation.
//!
//! Half: the plugin computes in fp32 behind the slot's widening boundary
//! (`megatron_transformer::mlp_half`), so its router and experts keep fp32 parameters while the
//! rest of the model is bf16/fp16; loss and gradients of one microbatch track the fp32 model
//! within the half type's rounding.
//!
//! Full recomputation with MoE layers (the `mlp` plugin, `megatron-moe`, linked in): a
//! recomputed MoE forward routes exactly as the first one and counts nothing twice, so losses,
//! every gradient, the logged metrics (aux/z losses, expert loads) and the expert-bias update
//! are bit-identical to keeping the activations, for both methods, with dropout on, back to
//! back and with microbatches in flight (where `global_aux_loss` must reuse the running average
//! of the first forward, not the one after later microbatches).

mod common;

use common::*;
use megatron_core::{Batch, DType, MlpProvider, Mode, Model, ParallelContext, Registry, StageOutput};
use megatron_gpt::{GptConfig, GptModel};
use megatron_transformer::{FullRecompute, LocalSpecProvider, RecomputeMethod, WithMlpProvider};

use megatron_moe as _;

type Choice = Option<(RecomputeMethod, usize)>;

const CHOICES: [Choice; 4] =
    [None, Some((RecomputeMethod::Uniform, 1)), Some((RecomputeMethod::Uniform, 2)), Some((RecomputeMethod::Block, 2))];

fn config(recompute: Choice) -> GptConfig {
    let mut c = tiny_config(64, 8);
    c.num_layers = 3;
    c.hidden_dropout = 0.1;
    c.attention_dropout = 0.1;
    c.init_method_std = 0.05;
    c.recompute = recompute.map(|(method, num_layers)| FullRecompute { method, num_layers });
    c
}

fn provider(balancing: &str) -> MlpProvider {
    let cfg = serde_json::json!({
        "num_experts": 4,
        "moe_router_topk": 2,
        "moe_router_load_balancing_type": balancing,
        "moe_aux_loss_coeff": 1e-2,
        "moe_z_loss_coeff": 1e-3,
        "moe_router_enable_expert_bias": true,
        "moe_router_bias_update_rate": 1e-2,
        "moe_expert_capacity_factor": 1.5,
        "moe_layer_freq": "([1]*1+[0]*1+[1]*1)*1",
        "num_microbatches": 4,
    });
    Registry::builtin().unwrap().mlp_provider("moe", cfg).unwrap()
}

fn model(recompute: Choice, balancing: &str) -> GptModel {
    let p = provider(balancing);
    let with = WithMlpProvider { inner: &LocalSpecProvider, mlp: &p };
    GptModel::with_provider(config(recompute), backend(), ParallelContext::single(), &with).unwrap()
}

fn loss_of(out: StageOutput) -> f64 {
    match out {
        StageOutput::Loss(r) => r.loss_sum,
        StageOutput::Hidden(_) => panic!("a single-stage model returns the loss"),
    }
}

/// Losses, gradients, metrics and the checkpointed buffers (expert bias) after the step.
type Run = (Vec<f64>, Vec<(String, Vec<f32>)>, Vec<(String, f64)>, Vec<(String, Vec<f32>)>);

fn host(model: &GptModel, t: &megatron_core::DeviceTensor) -> Vec<f32> {
    model.backend().to_host(t).unwrap().to_f32_vec()
}

/// Two steps: the 1F1B stash order (three microbatches in flight, an eval forward, backwards
/// out of order, a fourth microbatch), then `finalize_grads` (expert-bias update).
fn two_steps(recompute: Choice, balancing: &str) -> Run {
    let mut model = model(recompute, balancing);
    let c = model.config().clone();
    let bs: Vec<Batch> = (0..4).map(|i| batch(2, c.seq_length, c.vocab_size, 900 + i)).collect();
    let mut noop = |_: &[&megatron_core::Param]| Ok(());
    let mut losses = Vec::new();
    let mut metrics = Vec::new();
    for step in 0..2u64 {
        model.zero_grad().unwrap();
        let b: Vec<Batch> = bs.iter().map(|b| Batch { seed: b.seed + 10 * step, ..b.clone() }).collect();
        for (mb, b) in b.iter().enumerate().take(3) {
            losses.push(loss_of(model.forward_stage(mb, b, None, Mode::Train).unwrap()));
        }
        losses.push(loss_of(model.forward_stage(99, &b[0], None, Mode::Eval).unwrap()));
        model.backward_stage(1, None, 0.25, &mut noop).unwrap();
        model.backward_stage(0, None, 0.25, &mut noop).unwrap();
        losses.push(loss_of(model.forward_stage(3, &b[3], None, Mode::Train).unwrap()));
        model.backward_stage(3, None, 0.25, &mut noop).unwrap();
        model.backward_stage(2, None, 0.25, &mut noop).unwrap();
        model.finalize_grads().unwrap();
        metrics.extend(model.take_metrics());
    }
    let grads = model.params().iter().map(|p| (p.name.clone(), host(&model, &p.grad))).collect();
    let buffers = model.buffers().iter().map(|p| (p.name.clone(), host(&model, &p.value))).collect();
    (losses, grads, metrics, buffers)
}

#[test]
fn moe_full_recompute_is_bit_identical_and_counts_once() {
    for balancing in ["aux_loss", "global_aux_loss"] {
        let (want_losses, want_grads, want_metrics, want_buffers) = two_steps(None, balancing);
        assert!(want_grads.iter().any(|(n, _)| n.contains("mlp.router.weight")), "no MoE layer was built");
        assert!(!want_buffers.is_empty(), "the expert bias is a checkpointed buffer");
        assert!(want_metrics.iter().any(|(n, _)| n.contains("load_balancing_loss")), "{want_metrics:?}");
        for choice in &CHOICES[1..] {
            let (losses, grads, metrics, buffers) = two_steps(*choice, balancing);
            let what = format!("{balancing} {choice:?}");
            assert_eq!(losses, want_losses, "{what}: losses");
            for ((name, got), (_, want)) in grads.iter().zip(&want_grads) {
                assert!(got == want, "{what}: gradient of `{name}` differs");
            }
            assert_eq!(metrics, want_metrics, "{what}: metrics (counted once per microbatch)");
            assert_eq!(buffers, want_buffers, "{what}: expert bias after the updates");
        }
    }
}

/// Loss and concatenated gradients of one microbatch, and the model.
fn loss_and_grads(dtype: DType) -> (f64, Vec<f32>, GptModel) {
    let p = provider("aux_loss");
    let with = WithMlpProvider { inner: &LocalSpecProvider, mlp: &p };
    let mut c = config(None);
    (c.hidden_dropout, c.attention_dropout, c.params_dtype) = (0.0, 0.0, dtype);
    let mut m = GptModel::with_provider(c.clone(), backend(), ParallelContext::single(), &with).unwrap();
    let b = batch(2, c.seq_length, c.vocab_size, 5);
    let r = m.forward(&b, Mode::Train).unwrap();
    m.backward(1.0 / r.num_tokens as f32).unwrap();
    let g = m.params().iter().flat_map(|p| host(&m, &p.grad)).collect();
    (r.loss_sum / r.num_tokens, g, m)
}

// Tolerances as models/gpt/tests/half_precision.rs (bf16: 8 significant bits, fp16: 11).
#[test]
fn moe_gpt_in_bf16_and_fp16_tracks_fp32() {
    let (l32, g32, _) = loss_and_grads(DType::F32);
    for (dtype, loss_tol, grad_tol) in [(DType::BF16, 1e-2, 6e-2), (DType::F16, 2e-3, 1e-2)] {
        let (lh, gh, m) = loss_and_grads(dtype);
        for p in m.params() {
            let moe = p.name.contains(".mlp.router") || p.name.contains(".mlp.experts");
            assert_eq!(p.value.dtype(), if moe { DType::F32 } else { dtype }, "{}", p.name);
            assert_eq!(p.grad.dtype(), DType::F32, "{}", p.name);
        }
        let rel = ((lh - l32) / l32).abs();
        assert!(rel < loss_tol, "{dtype}: loss {lh} vs fp32 {l32} (rel {rel:.2e})");
        let d: f64 = gh.iter().zip(&g32).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
        let n: f64 = g32.iter().map(|y| (*y as f64).powi(2)).sum();
        let e = (d / n).sqrt();
        assert!(e < grad_tol && e > 0.0, "{dtype}: gradient rel. L2 error {e:.3e}");
    }
}
