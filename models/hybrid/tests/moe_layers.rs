//! `E` (MoE) layers of the hybrid pattern, filled by the MoE `mlp` plugin (`megatron-moe`,
//! linked here as the root's `moe` feature or `--plugin libmegatron_moe.so` does): the
//! parameters sit under Megatron's names, every gradient of a tiny `M*E` model (mixer,
//! attention, router, experts) matches central finite differences, and a one-expert, top-1
//! MoE layer given the weights of a dense `-` layer reproduces the dense model's loss and
//! gradients. Without the plugin an `E` is an error saying to load it (tests/model_grads.rs).

use megatron_core::{Backend, Batch, MemoryOps, MlpProvider, Mode, Model, ParallelContext, Param, Registry};
use megatron_cpu::CpuBackend;
use megatron_hybrid::{HybridConfig, HybridModel};
use megatron_transformer::grad_check::{check_params, worst};
use std::sync::Arc;

use megatron_moe as _;

const VOCAB: usize = 40;
const SEQ: usize = 7;

fn config(pattern: &str) -> HybridConfig {
    let mut c = HybridConfig::new(pattern, 16, 2, SEQ, VOCAB);
    c.mamba_head_dim = 4;
    c.mamba_num_groups = 2;
    c.mamba_state_dim = 4;
    c.mamba_chunk_size = 3;
    c.ffn_hidden_size = Some(24);
    c.hidden_dropout = 0.0;
    c.attention_dropout = 0.0;
    c.init_method_std = 0.2;
    c.seed = 11;
    c
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

fn provider(experts: usize, topk: usize) -> MlpProvider {
    let cfg = serde_json::json!({"num_experts": experts, "moe_router_topk": topk, "moe_aux_loss_coeff": 0.0});
    Registry::builtin().unwrap().mlp_provider("moe", cfg).unwrap()
}

fn model(pattern: &str, mlp: Option<&MlpProvider>) -> HybridModel {
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    HybridModel::with_mlp(config(pattern), "hybrid", be, ParallelContext::single(), mlp).unwrap()
}

fn params(m: &mut HybridModel) -> Vec<&mut Param> {
    m.params_mut()
}

#[test]
fn moe_layer_gradients_match_finite_differences() {
    let p = provider(4, 2);
    let mut m = model("M*E", Some(&p));
    let names: Vec<String> = m.params().iter().map(|p| p.name.clone()).collect();
    assert!(names.iter().any(|n| n == "decoder.layers.2.pre_mlp_layernorm.weight"), "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("decoder.layers.2.mlp.router")), "{names:?}");
    let be = CpuBackend::new();
    let b = batch();
    m.zero_grad().unwrap();
    m.forward(&b, Mode::Train).unwrap();
    m.backward(1.0).unwrap();
    let mut loss = |m: &mut HybridModel| Ok(m.forward(&b, Mode::Eval)?.loss_sum);
    let samples = check_params(&mut m, &be, params, &|_| true, &mut loss, 3, 1e-2, 1e-2).unwrap();
    let w = worst(&samples).unwrap();
    eprintln!("{} samples, worst: {w:?}", samples.len());
    assert!(w.rel_err < 2e-2, "worst gradient sample {w:?}");
}

/// The dense `-` layer's name of a one-expert MoE parameter.
fn dense_name(moe: &str) -> String {
    moe.replace("mlp.experts.local_experts.0.", "mlp.")
}

#[test]
fn one_expert_top1_moe_layer_equals_the_dense_mlp_layer() {
    let be = CpuBackend::new();
    let p = provider(1, 1);
    let (mut dense, mut moe) = (model("M*-", None), model("M*E", Some(&p)));
    {
        let src: Vec<(String, Vec<f32>)> =
            dense.params().iter().map(|p| (p.name.clone(), be.to_host(&p.value).unwrap().to_f32_vec())).collect();
        for q in moe.params_mut() {
            if let Some((_, v)) = src.iter().find(|(n, _)| *n == dense_name(&q.name)) {
                let shape = q.value.shape().to_vec();
                q.value = be.from_host(megatron_core::HostBuffer::F32(v.clone()), &shape).unwrap();
            } else {
                assert!(q.name.ends_with("mlp.router.weight"), "no dense counterpart for {}", q.name);
            }
        }
    }
    let b = batch();
    let run = |m: &mut HybridModel| {
        m.zero_grad().unwrap();
        let l = m.forward(&b, Mode::Train).unwrap().loss_sum;
        m.backward(1.0).unwrap();
        l
    };
    let (ld, lm) = (run(&mut dense), run(&mut moe));
    assert!((ld - lm).abs() <= 1e-6 * ld.abs(), "loss dense {ld} vs moe {lm}");
    let mut worst = 0.0f32;
    for q in moe.params() {
        let g = be.to_host(&q.grad).unwrap().to_f32_vec();
        let Some(d) = dense.params().into_iter().find(|p| p.name == dense_name(&q.name)) else {
            // softmax over one expert is 1 whatever the logit: the router gets no gradient
            assert!(g.iter().all(|v| *v == 0.0), "router gradient {g:?}");
            continue;
        };
        let want = be.to_host(&d.grad).unwrap().to_f32_vec();
        let scale = want.iter().fold(1e-12f32, |m, v| m.max(v.abs()));
        let e = g.iter().zip(&want).fold(0.0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
        worst = worst.max(e);
        assert!(e < 1e-5, "{}: gradient differs by {e:.2e}", q.name);
    }
    eprintln!("one-expert MoE vs dense: loss {lm} (dense {ld}), worst gradient rel err {worst:.2e}");
}
