//! Full activation recomputation of the hybrid model (`--recompute-granularity full`): Mamba,
//! attention, MLP and MoE (`E`) layers recomputed from their unit's input give losses, every
//! gradient and the MoE metrics bit-identical to keeping the activations, with dropout on, for
//! both methods and short last units, back to back with eval forwards in between and with
//! microbatches in flight (the 1F1B stash order), in fp32 and bf16.

use megatron_core::{Backend, Batch, DType, MlpProvider, Mode, Model, ParallelContext, Param, Registry, StageOutput};
use megatron_cpu::CpuBackend;
use megatron_hybrid::{HybridConfig, HybridModel};
use megatron_transformer::{FullRecompute, RecomputeMethod};
use std::sync::Arc;

use megatron_moe as _;

const VOCAB: usize = 40;
const SEQ: usize = 9;

type Choice = Option<(RecomputeMethod, usize)>;

const CHOICES: [Choice; 5] = [
    None,
    Some((RecomputeMethod::Uniform, 1)),
    Some((RecomputeMethod::Uniform, 2)),
    Some((RecomputeMethod::Uniform, 4)), // units 0..4 and 4..5
    Some((RecomputeMethod::Block, 3)),
];

fn config(recompute: Choice, dtype: DType) -> HybridConfig {
    let mut c = HybridConfig::new("M*E-M", 16, 2, SEQ, VOCAB);
    c.mamba_head_dim = 4;
    c.mamba_num_groups = 2;
    c.mamba_state_dim = 4;
    c.mamba_chunk_size = 4;
    c.ffn_hidden_size = Some(24);
    c.hidden_dropout = 0.1;
    c.attention_dropout = 0.1;
    c.init_method_std = 0.1;
    c.make_vocab_size_divisible_by = 8;
    c.seed = 7;
    c.params_dtype = dtype;
    c.recompute = recompute.map(|(method, num_layers)| FullRecompute { method, num_layers });
    c
}

fn provider() -> MlpProvider {
    let cfg = serde_json::json!({
        "num_experts": 4,
        "moe_router_topk": 2,
        "moe_router_load_balancing_type": "global_aux_loss",
        "moe_aux_loss_coeff": 1e-2,
        "moe_z_loss_coeff": 1e-3,
        "num_microbatches": 4,
    });
    Registry::builtin().unwrap().mlp_provider("moe", cfg).unwrap()
}

fn batch(seed: u64) -> Batch {
    let n = 2 * SEQ;
    let s = seed as usize;
    Batch {
        micro_batch_size: 2,
        seq_length: SEQ,
        tokens: (0..n).map(|i| ((i * 7 + 3 * s) % VOCAB) as i32).collect(),
        labels: (0..n).map(|i| ((i * 5 + s) % VOCAB) as i32).collect(),
        loss_mask: vec![1.0; n],
        seed,
    }
}

fn loss_of(out: StageOutput) -> f64 {
    match out {
        StageOutput::Loss(r) => r.loss_sum,
        StageOutput::Hidden(_) => panic!("a single-stage model returns the loss"),
    }
}

type Run = (Vec<f64>, Vec<(String, Vec<f32>)>, Vec<(String, f64)>);

/// Two steps: three microbatches in flight, an eval forward, backwards out of order, a fourth
/// microbatch; then the step's `finalize_grads` and metrics.
fn two_steps(recompute: Choice, dtype: DType) -> Run {
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let p = provider();
    let mut m =
        HybridModel::with_mlp(config(recompute, dtype), "hybrid", be.clone(), ParallelContext::single(), Some(&p))
            .unwrap();
    let mut noop = |_: &[&Param]| Ok(());
    let (mut losses, mut metrics) = (Vec::new(), Vec::new());
    for step in 0..2u64 {
        m.zero_grad().unwrap();
        let b: Vec<Batch> = (0..4).map(|i| batch(10 * step + i + 1)).collect();
        for (mb, b) in b.iter().enumerate().take(3) {
            losses.push(loss_of(m.forward_stage(mb, b, None, Mode::Train).unwrap()));
        }
        losses.push(loss_of(m.forward_stage(99, &b[0], None, Mode::Eval).unwrap()));
        m.backward_stage(1, None, 0.25, &mut noop).unwrap();
        m.backward_stage(0, None, 0.25, &mut noop).unwrap();
        losses.push(loss_of(m.forward_stage(3, &b[3], None, Mode::Train).unwrap()));
        m.backward_stage(3, None, 0.25, &mut noop).unwrap();
        m.backward_stage(2, None, 0.25, &mut noop).unwrap();
        m.finalize_grads().unwrap();
        metrics.extend(m.take_metrics());
    }
    let grads = m.params().iter().map(|p| (p.name.clone(), be.to_host(&p.grad).unwrap().to_f32_vec())).collect();
    (losses, grads, metrics)
}

#[test]
fn hybrid_full_recompute_is_bit_identical() {
    for dtype in [DType::F32, DType::BF16] {
        let (want_losses, want_grads, want_metrics) = two_steps(None, dtype);
        assert!(want_metrics.iter().any(|(n, _)| n.contains("load_balancing_loss")), "{want_metrics:?}");
        for choice in &CHOICES[1..] {
            let what = format!("{dtype} {choice:?}");
            let (losses, grads, metrics) = two_steps(*choice, dtype);
            assert_eq!(losses, want_losses, "{what}: losses");
            for ((name, got), (_, want)) in grads.iter().zip(&want_grads) {
                assert!(got == want, "{what}: gradient of `{name}` differs");
            }
            assert_eq!(metrics, want_metrics, "{what}: MoE metrics (counted once)");
        }
    }
}
