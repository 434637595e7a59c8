//! Every gradient of the MoE layer — input, router weight (through top-k gates, the aux /
//! seq-aux / z losses), expert weights — against central finite differences of the objective
//! `J = Σ out·R + aux + z` (aux and z are added to the gradient by the layer itself), for each
//! score function, with capacity dropping and padding, SwiGLU and GeLU.

mod common;

use common::*;
use megatron_core::{Backend, MlpModule, MlpStep};
use megatron_moe::MoeLayer;
use serde_json::json;

const B: usize = 2;
const T: usize = 5;

fn objective(layer: &mut MoeLayer, bk: &dyn Backend, x: &[f32], r: &[f32]) -> f64 {
    let xt = tensor(bk, x.to_vec(), &[B, T, C]);
    let mut out = tensor(bk, vec![0.0; B * T * C], &[B, T, C]);
    layer.forward(&xt, &mut out, MlpStep { batch: B, seq: T, train: true, seed: 1 }).expect("forward");
    let o = out.host_f32().expect("host");
    let dot: f64 = o.iter().zip(r).map(|(a, b)| *a as f64 * *b as f64).sum();
    dot + layer.last_losses.0 + layer.last_losses.1
}

fn check(cfg: serde_json::Value, swiglu: bool, bias: Option<Vec<f32>>) {
    let bk = backend();
    let mut layer = layer(config(cfg.clone()), megatron_core::ParallelContext::single(), swiglu);
    if let Some(b) = &bias {
        layer.expert_bias.value.host_f32_mut().unwrap().copy_from_slice(b);
    }
    let x = rand(B * T * C, 3, 1.0);
    let r = rand(B * T * C, 4, 1.0);
    // Analytic gradients.
    let xt = tensor(bk.as_ref(), x.clone(), &[B, T, C]);
    let mut out = tensor(bk.as_ref(), vec![0.0; B * T * C], &[B, T, C]);
    layer.forward(&xt, &mut out, MlpStep { batch: B, seq: T, train: true, seed: 1 }).expect("forward");
    let dout = tensor(bk.as_ref(), r.clone(), &[B, T, C]);
    let mut dx = tensor(bk.as_ref(), vec![0.0; B * T * C], &[B, T, C]);
    layer.backward(&xt, &dout, &mut dx).expect("backward");
    let dx = dx.host_f32().expect("host").to_vec();
    let grads: Vec<Vec<f32>> = layer.params().iter().map(|p| p.grad.host_f32().expect("grad").to_vec()).collect();
    let eps = 1e-3f32;
    let close = |fd: f64, an: f32, what: &str| {
        let tol = 4e-3 + 2e-2 * an.abs() as f64;
        assert!((fd - an as f64).abs() <= tol, "{cfg}: {what}: finite difference {fd} vs analytic {an}");
    };
    // Input.
    for i in (0..x.len()).step_by(7) {
        let (mut xp, mut xm) = (x.clone(), x.clone());
        xp[i] += eps;
        xm[i] -= eps;
        let fd = (objective(&mut layer, bk.as_ref(), &xp, &r) - objective(&mut layer, bk.as_ref(), &xm, &r))
            / (2.0 * eps as f64);
        close(fd, dx[i], &format!("d x[{i}]"));
    }
    // Router weight (param 0) everywhere, and a sample of every expert weight.
    for (p, grad) in grads.iter().enumerate() {
        let numel = layer.params()[p].value.numel();
        let step = if p == 0 { 1 } else { 5 };
        for i in (0..numel).step_by(step) {
            fn bump(layer: &mut MoeLayer, p: usize, i: usize, delta: f32) {
                let mut params = layer.params_mut();
                params[p].value.host_f32_mut().expect("value")[i] += delta;
            }
            bump(&mut layer, p, i, eps);
            let jp = objective(&mut layer, bk.as_ref(), &x, &r);
            bump(&mut layer, p, i, -2.0 * eps);
            let jm = objective(&mut layer, bk.as_ref(), &x, &r);
            bump(&mut layer, p, i, eps);
            let name = layer.params()[p].name.clone();
            close((jp - jm) / (2.0 * eps as f64), grad[i], &format!("d {name}[{i}]"));
        }
    }
}

#[test]
fn softmax_top2_with_aux_and_z_loss() {
    check(
        json!({"num_experts": 4, "moe_router_topk": 2, "moe_aux_loss_coeff": 0.5, "moe_z_loss_coeff": 0.1}),
        true,
        None,
    );
}

#[test]
fn pre_softmax_seq_aux_loss_gelu() {
    check(
        json!({"num_experts": 4, "moe_router_topk": 2, "moe_router_pre_softmax": true,
               "moe_router_load_balancing_type": "seq_aux_loss", "moe_aux_loss_coeff": 0.5,
               "moe_router_topk_scaling_factor": 1.5}),
        false,
        None,
    );
}

#[test]
fn sigmoid_with_expert_bias() {
    check(
        json!({"num_experts": 4, "moe_router_topk": 2, "moe_router_score_function": "sigmoid",
               "moe_aux_loss_coeff": 0.3, "moe_router_enable_expert_bias": true}),
        true,
        Some(vec![0.05, -0.02, 0.0, 0.03]),
    );
}

#[test]
fn capacity_dropping_both_policies_and_padding() {
    for policy in ["probs", "position"] {
        check(
            json!({"num_experts": 4, "moe_router_topk": 2, "moe_expert_capacity_factor": 1.0,
                   "moe_token_drop_policy": policy, "moe_pad_expert_input_to_capacity": policy == "probs",
                   "moe_aux_loss_coeff": 0.2}),
            true,
            None,
        );
    }
}

#[test]
fn shared_expert_with_and_without_its_gate() {
    let base = json!({"num_experts": 4, "moe_router_topk": 2, "moe_shared_expert_intermediate_size": 6});
    let mut gated = base.clone();
    gated["moe_shared_expert_gate"] = json!(true);
    check(gated, true, None);
    check(base, false, None);
}
