//! bf16/fp16 hybrid models (SPEC §6.7): Mamba mixers, attention, MLP and MoE (`E`) layers with
//! half parameters (the MoE plugin's stay fp32 behind the slot's widening boundary) and
//! activations, fp32 gradient buffers. The same model in fp32 is the reference: the loss and
//! every gradient of one microbatch agree within the half type's rounding (tolerances below).

use megatron_core::half_parity::{assert_half_matches_fp32, assert_param_dtypes, one_step};
use megatron_core::{Backend, Batch, DType, MlpProvider, Model, ParallelContext, Param, Registry};
use megatron_cpu::CpuBackend;
use megatron_hybrid::{HybridConfig, HybridModel};
use std::sync::Arc;

use megatron_moe as _;

const VOCAB: usize = 40;
const SEQ: usize = 12;

fn config(dtype: DType, fp32_residual: bool) -> HybridConfig {
    let mut c = HybridConfig::new("M*-ME", 16, 2, SEQ, VOCAB);
    c.mamba_head_dim = 4;
    c.mamba_num_groups = 2;
    c.mamba_state_dim = 4;
    c.mamba_chunk_size = 5;
    c.ffn_hidden_size = Some(24);
    c.hidden_dropout = 0.0;
    c.attention_dropout = 0.0;
    c.init_method_std = 0.2;
    c.make_vocab_size_divisible_by = 8;
    c.seed = 5;
    c.params_dtype = dtype;
    c.fp32_residual_connection = fp32_residual;
    c
}

fn provider() -> MlpProvider {
    let cfg = serde_json::json!({"num_experts": 4, "moe_router_topk": 2, "moe_aux_loss_coeff": 1e-2});
    Registry::builtin().unwrap().mlp_provider("moe", cfg).unwrap()
}

fn batch() -> Batch {
    let n = 2 * SEQ;
    Batch {
        micro_batch_size: 2,
        seq_length: SEQ,
        tokens: (0..n).map(|i| ((i * 7 + 3) % VOCAB) as i32).collect(),
        labels: (0..n).map(|i| ((i * 5 + 1) % VOCAB) as i32).collect(),
        loss_mask: vec![1.0; n],
        seed: 3,
    }
}

/// Loss, concatenated gradients and the model after one microbatch.
fn loss_and_grads(c: HybridConfig) -> (f64, Vec<f32>, HybridModel) {
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let p = provider();
    let mut m = HybridModel::with_mlp(c, "hybrid", be.clone(), ParallelContext::single(), Some(&p)).unwrap();
    let (loss, grads) = one_step(&mut m, &batch(), be.as_ref());
    (loss, grads, m)
}

fn check(dtype: DType, fp32_residual: bool, loss_tol: f64, grad_tol: f64) {
    let (l32, g32, _) = loss_and_grads(config(DType::F32, false));
    let (lh, gh, m) = loss_and_grads(config(dtype, fp32_residual));
    // The MoE plugin computes in fp32: its router and experts keep fp32 parameters.
    let moe = |p: &Param| p.name.contains(".mlp.router") || p.name.contains(".mlp.experts");
    assert_param_dtypes(&m.params(), |p| if moe(p) { DType::F32 } else { dtype });
    assert!(m.params().iter().any(|p| p.name.ends_with("mixer.in_proj.weight") && p.value.dtype() == dtype));
    assert_eq!(m.residual_dtype(), if fp32_residual { DType::F32 } else { dtype });
    let what = format!("{dtype} (fp32 residual {fp32_residual})");
    assert_half_matches_fp32(&what, &[("loss", lh, l32)], &gh, &g32, loss_tol, grad_tol);
}

// Tolerances as the GPT's (models/gpt/tests/half_precision.rs): bf16 keeps 8 significant bits
// (2^-9 ≈ 2e-3 relative rounding per value), fp16 11 bits (about 8x tighter).
#[test]
fn bf16_hybrid_matches_fp32_within_bf16_rounding() {
    check(DType::BF16, false, 1e-2, 6e-2);
    check(DType::BF16, true, 1e-2, 6e-2);
}

#[test]
fn fp16_hybrid_matches_fp32_within_fp16_rounding() {
    check(DType::F16, false, 2e-3, 1e-2);
}
