//! The tp4 x pp2 GPT written by Megatron-LM's own code in both its formats
//! (scripts/megatron_tp4pp2_fixture.py; tests/fixtures/megatron_tp4pp2): the legacy files with
//! Megatron's optimizer state (3 AdamW steps, lr 0, grad = param) and the `torch_dist` files
//! of the same weights.

use megatron_checkpoint_megatron::legacy_write::{write_legacy, OptimizerOut};
use megatron_checkpoint_megatron::optim_read::read_optimizer;
use megatron_checkpoint_megatron::optim_write::GroupHyper;
use megatron_checkpoint_megatron::partition::Shape;
use megatron_checkpoint_megatron::{dist, legacy};
use std::path::PathBuf;

fn fixture(sub: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/megatron_tp4pp2").join(sub)
}

#[test]
fn torch_dist_weights_equal_the_legacy_weights_bit_for_bit() {
    let legacy = legacy::open(&fixture("legacy"), None).unwrap();
    let dist = dist::open(&fixture("torch_dist"), None).unwrap();
    assert_eq!(dist.iteration(), 6);
    assert_eq!((dist.shape.tp, dist.shape.pp, dist.shape.num_layers), (4, 2, 4));
    assert_eq!(dist.scheduler_state().unwrap().to_json()["num_steps"], 12);
    // Layer stacks: one key for all 4 layers, 4 layers x 4 tp chunks.
    let qkv = &dist.tensors["decoder.layers.self_attention.linear_qkv.weight"];
    assert_eq!((qkv.size.clone(), qkv.chunks.len()), (vec![4, 96, 32], 16));
    let a = legacy.full_tensors(&mut |_, _| {}).unwrap();
    let b = dist.full_tensors(&mut |_, _| {}).unwrap();
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (name, t) in &a {
        assert_eq!(t, &b[name], "`{name}` differs between the legacy and torch_dist files");
    }
    println!("torch_dist == legacy for all {} tensors", a.len());
}

#[test]
fn megatron_adam_state_is_placed_on_the_right_parameters() {
    let ck = legacy::open(&fixture("legacy"), None).unwrap();
    let params = ck.full_tensors(&mut |_, _| {}).unwrap();
    let opt = read_optimizer(&ck).unwrap().expect("the fixture has optimizer state");
    assert_eq!(opt.step, 3);
    // Megatron's grouping: weight-decayed, then biases and 1-D tensors (wd_mult 0).
    let wd: Vec<_> = opt.param_groups.iter().map(|g| g["wd_mult"].as_f64().unwrap()).collect();
    assert_eq!(wd, vec![1.0, 0.0]);
    // With lr 0 and grad = param, after 3 steps exp_avg = (1 - b1^3) p, exp_avg_sq = (1 - b2^3) p^2.
    let (c1, c2) = (1.0 - 0.9f64.powi(3), 1.0 - 0.999f64.powi(3));
    let mut worst = 0f64;
    for (name, p) in &params {
        let m = opt.tensors[&(name.clone(), "exp_avg".to_string())].to_f32();
        let v = opt.tensors[&(name.clone(), "exp_avg_sq".to_string())].to_f32();
        for ((&p, &m), &v) in p.to_f32().iter().zip(&m).zip(&v) {
            let p = f64::from(p);
            worst = worst.max((f64::from(m) - c1 * p).abs() / (c1 * p.abs()).max(1e-6));
            worst = worst.max((f64::from(v) - c2 * p * p).abs() / (c2 * p * p).max(1e-9));
        }
    }
    assert_eq!(opt.tensors.len(), 2 * params.len());
    println!("Adam moments vs closed form: worst relative error {worst:.2e} over {} tensors", params.len());
    assert!(worst < 1e-5, "moments misplaced: worst relative error {worst:e}");
}

#[test]
fn legacy_rewrite_with_optimizer_state_reads_back_bit_identically() {
    let ck = legacy::open(&fixture("legacy"), None).unwrap();
    let params = ck.full_tensors(&mut |_, _| {}).unwrap();
    let opt = read_optimizer(&ck).unwrap().unwrap();
    let args = ck.args.to_json();
    let tmp = tempfile::tempdir().unwrap();
    for (tp, pp) in [(2, 1), (1, 4)] {
        let mut check = args.clone();
        check["tensor_model_parallel_size"] = tp.into();
        check["pipeline_model_parallel_size"] = pp.into();
        let target = Shape::from_args(&megatron_checkpoint_megatron::Value::from_json(&check), tmp.path()).unwrap();
        let out = tmp.path().join(format!("tp{tp}pp{pp}"));
        let o = OptimizerOut { state: &opt, half: false, hyper: GroupHyper::from_args(&args) };
        write_legacy(&out, 6, &params, &target, &check, &serde_json::Value::Null, Some(&o), &mut |_, _| {}).unwrap();
        let back = legacy::open(&out, None).unwrap();
        assert_eq!(back.full_tensors(&mut |_, _| {}).unwrap(), params);
        let opt2 = read_optimizer(&back).unwrap().unwrap();
        assert_eq!(opt2.step, 3);
        assert_eq!(opt2.tensors, opt.tensors, "optimizer state changed through tp{tp} x pp{pp}");
    }
}

/// The parameter names of each rank file's `model`, in stored order (`_extra_state` left out).
fn model_keys(ck: &legacy::LegacyCheckpoint) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for row in &ck.shards {
        for f in row {
            let m = f.root.get("model").and_then(megatron_checkpoint_megatron::Value::items).unwrap();
            let keys = m.iter().filter_map(|(k, _)| k.as_str()).filter(|k| !k.ends_with("_extra_state"));
            out.push(keys.map(str::to_string).collect());
        }
    }
    out
}

#[test]
fn written_layout_has_megatrons_key_order_and_param_groups() {
    let ck = legacy::open(&fixture("legacy"), None).unwrap();
    let params = ck.full_tensors(&mut |_, _| {}).unwrap();
    let opt = read_optimizer(&ck).unwrap().unwrap();
    let args = ck.args.to_json();
    let tmp = tempfile::tempdir().unwrap();
    let o = OptimizerOut { state: &opt, half: false, hyper: GroupHyper::from_args(&args) };
    write_legacy(tmp.path(), 6, &params, &ck.shape, &args, &serde_json::Value::Null, Some(&o), &mut |_, _| {}).unwrap();
    let ours = legacy::open(tmp.path(), None).unwrap();
    // Optimizer indices follow module order, so the order is part of the format.
    assert_eq!(model_keys(&ours), model_keys(&ck));
    let groups = |c: &legacy::LegacyCheckpoint| -> Vec<String> {
        c.shards
            .iter()
            .flatten()
            .map(|f| f.root.get("optimizer").unwrap().get("param_groups").unwrap().to_json())
            .map(|g| {
                g.as_array()
                    .unwrap()
                    .iter()
                    .map(|g| format!("{} {}", g["wd_mult"], g["params"]))
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .collect()
    };
    assert_eq!(groups(&ours), groups(&ck));
}

/// A bf16 model's state goes in Megatron's fp16 wrapper (`optimizer`, `grad_scaler`,
/// `fp32_from_fp16_params`) and reads back bit-identically, fp32 main params included.
#[test]
fn half_precision_optimizer_state_round_trips_with_main_params() {
    use megatron_checkpoint_megatron::{TensorData, TorchDType};
    let ck = legacy::open(&fixture("legacy"), None).unwrap();
    let fp32 = ck.full_tensors(&mut |_, _| {}).unwrap();
    let mut opt = read_optimizer(&ck).unwrap().unwrap();
    let mut params = std::collections::BTreeMap::new();
    for (name, t) in &fp32 {
        let bytes = t.to_f32().iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect();
        params.insert(name.clone(), TensorData { dtype: TorchDType::BF16, shape: t.shape.clone(), bytes });
        opt.tensors.insert((name.clone(), "main_param".to_string()), t.clone());
    }
    opt.grad_scaler = Some(serde_json::json!({"scale": 65536.0, "growth_tracker": 3, "hysteresis_tracker": 2}));
    let args = ck.args.to_json();
    let tmp = tempfile::tempdir().unwrap();
    let o = OptimizerOut { state: &opt, half: true, hyper: GroupHyper::from_args(&args) };
    write_legacy(tmp.path(), 6, &params, &ck.shape, &args, &serde_json::Value::Null, Some(&o), &mut |_, _| {}).unwrap();
    let back = legacy::open(tmp.path(), None).unwrap();
    let root = &back.shards[1][3].root;
    let wrapper = root.get("optimizer").unwrap();
    assert!(wrapper.get("fp32_from_fp16_params").is_some() && wrapper.get("optimizer").is_some());
    assert_eq!(back.full_tensors(&mut |_, _| {}).unwrap(), params);
    let opt2 = read_optimizer(&back).unwrap().unwrap();
    assert_eq!(opt2.tensors, opt.tensors);
    assert_eq!(opt2.grad_scaler, opt.grad_scaler);
}
