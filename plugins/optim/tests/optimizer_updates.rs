//! Adam and SGD updates on the CPU backend against updates computed by hand in f64, and the
//! per-parameter state round trip with its error paths.

use megatron_core::{Backend, DType, HostBuffer, MemoryOps, Optimizer, OptimizerState, Param, ParamLayout};
use megatron_cpu::CpuBackend;
use megatron_optim::{Adam, AdamConfig, Sgd, SgdConfig};

/// fp32 kernels against an f64 reference over two steps.
const TOL: f64 = 1e-6;

fn param(b: &dyn Backend, name: &str, value: &[f32], grad: &[f32], no_wd: bool) -> Param {
    let shape = [value.len()];
    Param {
        name: name.into(),
        value: b.from_host(HostBuffer::F32(value.to_vec()), &shape).unwrap(),
        grad: b.from_host(HostBuffer::F32(grad.to_vec()), &shape).unwrap(),
        layout: ParamLayout::replicated(&shape, no_wd),
    }
}

fn values(b: &dyn Backend, p: &Param) -> Vec<f32> {
    b.to_host(&p.value).unwrap().to_f32_vec()
}

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!((g as f64 - w).abs() <= TOL * w.abs().max(1.0), "{what}[{i}]: got {g}, want {w}");
    }
}

/// AdamW written out: decoupled decay, then the bias-corrected moment update.
fn adam_reference(p0: &[f32], grads: &[&[f32]], lr: f64, wd: f64) -> Vec<f64> {
    let (b1, b2, eps) = (0.9f64, 0.999f64, 1e-8f64);
    let mut p: Vec<f64> = p0.iter().map(|&x| x as f64).collect();
    let mut m = vec![0.0; p.len()];
    let mut v = vec![0.0; p.len()];
    for (t, g) in grads.iter().enumerate() {
        let t = (t + 1) as i32;
        for i in 0..p.len() {
            let g = g[i] as f64;
            p[i] -= lr * wd * p[i];
            m[i] = b1 * m[i] + (1.0 - b1) * g;
            v[i] = b2 * v[i] + (1.0 - b2) * g * g;
            let m_hat = m[i] / (1.0 - b1.powi(t));
            let v_hat = v[i] / (1.0 - b2.powi(t));
            p[i] -= lr * m_hat / (v_hat.sqrt() + eps);
        }
    }
    p
}

fn set_grad(b: &dyn Backend, p: &mut Param, g: &[f32]) {
    p.grad = b.from_host(HostBuffer::F32(g.to_vec()), &[g.len()]).unwrap();
}

#[test]
fn adam_two_steps_match_the_hand_computed_update() {
    let b = CpuBackend::new();
    let (p0, g1, g2) = ([0.5f32, -1.0, 2.0], [0.1f32, -0.2, 0.3], [-0.05f32, 0.4, 0.3]);
    let mut w = param(&b, "w", &p0, &g1, false);
    let mut bias = param(&b, "b", &p0, &g1, true);
    let mut adam = Adam::new(AdamConfig::default()).unwrap();
    adam.step(&mut [&mut w, &mut bias], 1e-2, 0.1, &b).unwrap();
    set_grad(&b, &mut w, &g2);
    set_grad(&b, &mut bias, &g2);
    adam.step(&mut [&mut w, &mut bias], 1e-2, 0.1, &b).unwrap();
    assert_eq!(adam.steps(), 2);
    assert_close(&values(&b, &w), &adam_reference(&p0, &[&g1, &g2], 1e-2, 0.1), "decayed weight");
    assert_close(&values(&b, &bias), &adam_reference(&p0, &[&g1, &g2], 1e-2, 0.0), "no_weight_decay bias");
}

#[test]
fn sgd_two_steps_match_the_hand_computed_update() {
    let b = CpuBackend::new();
    let (p0, g1, g2) = ([0.5f32, -1.0], [0.1f32, -0.2], [0.3f32, 0.4]);
    let mut w = param(&b, "w", &p0, &g1, false);
    let mut sgd = Sgd::new(SgdConfig::default()).unwrap();
    sgd.step(&mut [&mut w], 0.1, 0.01, &b).unwrap();
    set_grad(&b, &mut w, &g2);
    sgd.step(&mut [&mut w], 0.1, 0.01, &b).unwrap();
    // torch.optim.SGD: g' = g + wd p; buf = g' (first), then 0.9 buf + g'; p -= lr buf.
    let mut want = Vec::new();
    for i in 0..2 {
        let mut p = p0[i] as f64;
        let mut buf = g1[i] as f64 + 0.01 * p;
        p -= 0.1 * buf;
        buf = 0.9 * buf + g2[i] as f64 + 0.01 * p;
        p -= 0.1 * buf;
        want.push(p);
    }
    assert_close(&values(&b, &w), &want, "sgd");
}

#[test]
fn adam_state_round_trip_continues_identically() {
    let b = CpuBackend::new();
    let mut a = param(&b, "layer.weight", &[0.3, -0.7, 1.1, 0.2], &[0.5, 0.1, -0.3, 0.2], false);
    let mut a2 = param(&b, "layer.weight", &[0.3, -0.7, 1.1, 0.2], &[0.5, 0.1, -0.3, 0.2], false);
    let mut first = Adam::new(AdamConfig::default()).unwrap();
    first.step(&mut [&mut a], 1e-2, 0.0, &b).unwrap();
    let mut resumed = Adam::new(AdamConfig::default()).unwrap();
    let state = first.state(&b).unwrap();
    assert_eq!(state.scalars, serde_json::json!({"step": 1}));
    let names: Vec<&str> = state.tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["layer.weight.exp_avg", "layer.weight.exp_avg_sq"]);
    resumed.load_state(state, &[&a], &b).unwrap();
    assert_eq!(resumed.steps(), 1);
    // Bring the second param to the same value, then step both optimizers once more.
    b.copy(&a.value, &mut a2.value).unwrap();
    first.step(&mut [&mut a], 1e-2, 0.0, &b).unwrap();
    resumed.step(&mut [&mut a2], 1e-2, 0.0, &b).unwrap();
    assert_eq!(values(&b, &a), values(&b, &a2));
}

#[test]
fn sgd_state_round_trip_keeps_the_momentum() {
    let b = CpuBackend::new();
    let mut w = param(&b, "w", &[1.0, 2.0], &[0.5, -0.5], false);
    let mut w2 = param(&b, "w", &[1.0, 2.0], &[0.5, -0.5], false);
    let mut first = Sgd::new(SgdConfig { momentum: 0.5 }).unwrap();
    first.step(&mut [&mut w], 0.1, 0.0, &b).unwrap();
    let mut resumed = Sgd::new(SgdConfig { momentum: 0.5 }).unwrap();
    let state = first.state(&b).unwrap();
    assert_eq!(state.tensors[0].0, "w.momentum_buffer");
    resumed.load_state(state, &[&w], &b).unwrap();
    b.copy(&w.value, &mut w2.value).unwrap();
    first.step(&mut [&mut w], 0.1, 0.0, &b).unwrap();
    resumed.step(&mut [&mut w2], 0.1, 0.0, &b).unwrap();
    assert_eq!(values(&b, &w), values(&b, &w2));
}

#[test]
fn load_state_errors_name_the_tensor() {
    let b = CpuBackend::new();
    let mut w = param(&b, "w", &[1.0, 2.0], &[0.5, -0.5], false);
    let mut adam = Adam::new(AdamConfig::default()).unwrap();
    adam.step(&mut [&mut w], 0.1, 0.0, &b).unwrap();

    let mut missing = adam.state(&b).unwrap();
    missing.tensors.retain(|(n, _)| n != "w.exp_avg_sq");
    let err = Adam::new(AdamConfig::default()).unwrap().load_state(missing, &[&w], &b).unwrap_err().to_string();
    assert!(err.contains("w.exp_avg_sq"), "{err}");

    let mut wrong_shape = adam.state(&b).unwrap();
    wrong_shape.tensors[0].1 = b.zeros(&[3], DType::F32).unwrap();
    let err = Adam::new(AdamConfig::default()).unwrap().load_state(wrong_shape, &[&w], &b).unwrap_err().to_string();
    assert!(err.contains("w.exp_avg") && err.contains("[3]"), "{err}");

    let sgd_state = {
        let mut sgd = Sgd::new(SgdConfig::default()).unwrap();
        sgd.step(&mut [&mut w], 0.1, 0.0, &b).unwrap();
        sgd.state(&b).unwrap()
    };
    let err = Adam::new(AdamConfig::default()).unwrap().load_state(sgd_state, &[&w], &b).unwrap_err().to_string();
    assert!(err.contains("w.momentum_buffer") && err.contains("--optimizer"), "{err}");

    let no_step = OptimizerState { scalars: serde_json::json!({}), tensors: Vec::new() };
    let err = Adam::new(AdamConfig::default()).unwrap().load_state(no_step, &[&w], &b).unwrap_err().to_string();
    assert!(err.contains("step"), "{err}");
}
