//! The router's top-k selection and gate weights against Megatron-Core's own
//! `topk_routing_with_score_function` (pip `megatron-core`, run on CPU torch): softmax after
//! and before top-k, sigmoid with the expert bias, with and without group-limited routing.
//! Skips with a message when `$MEGATRON_PYTHON` (default /work/venv/bin/python) cannot import
//! megatron.core.

use megatron_moe::router::{select, Score};
use std::process::Command;

const ORACLE: &str = r#"
import json, warnings
warnings.filterwarnings("ignore")
import torch
from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function as route
torch.manual_seed(1234)
cases = []
for (e, k, groups, gk, score, pre, bias) in [
    (8, 2, None, None, "softmax", False, False),
    (8, 4, 4, 2, "softmax", False, False),
    (16, 4, 4, 2, "softmax", True, False),
    (16, 6, 8, 3, "sigmoid", False, True),
    (12, 3, 3, 1, "sigmoid", False, False),
]:
    logits = torch.randn(32, e)
    b = torch.randn(e) * 0.1 if bias else None
    probs, _ = route(logits, k, use_pre_softmax=pre, num_groups=groups, group_topk=gk,
                     score_function=score, expert_bias=b)
    cases.append(dict(e=e, k=k, groups=groups, gk=gk, score=score, pre=pre,
                      bias=(b.tolist() if b is not None else [0.0] * e),
                      logits=logits.flatten().tolist(), probs=probs.flatten().tolist()))
print(json.dumps(cases))
"#;

#[test]
fn selection_and_gates_match_megatron_core() {
    let py = std::env::var("MEGATRON_PYTHON").unwrap_or_else(|_| "/work/venv/bin/python".into());
    let out = match Command::new(&py).args(["-c", ORACLE]).output() {
        Ok(o) if o.status.success() => o,
        _ => {
            println!("SKIP: {py} cannot run megatron.core's router (set MEGATRON_PYTHON to a python with torch + megatron-core)");
            return;
        }
    };
    let cases: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("oracle JSON");
    assert_eq!(cases.len(), 5);
    for c in &cases {
        let f =
            |key: &str| -> Vec<f32> { c[key].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect() };
        let (e, k) = (c["e"].as_u64().unwrap() as usize, c["k"].as_u64().unwrap() as usize);
        let groups = c["groups"].as_u64().map(|g| (g as usize, c["gk"].as_u64().unwrap() as usize));
        let score = match (c["score"].as_str().unwrap(), c["pre"].as_bool().unwrap()) {
            ("sigmoid", _) => Score::Sigmoid,
            (_, true) => Score::SoftmaxPre,
            _ => Score::SoftmaxPost,
        };
        let (logits, bias, want) = (f("logits"), f("bias"), f("probs"));
        let (idx, gate) = select(score, &logits, e, k, &bias, 1.0, groups);
        let mut dense = vec![0.0f32; logits.len()];
        for (a, (&j, &g)) in idx.iter().zip(&gate).enumerate() {
            dense[(a / k) * e + j as usize] = g;
        }
        for (i, (a, b)) in dense.iter().zip(&want).enumerate() {
            // Same experts (a zero on one side and not the other fails), gates within float noise.
            assert!((a - b).abs() <= 1e-6, "{c:?}: token {} expert {}: ours {a}, megatron {b}", i / e, i % e);
        }
    }
}
