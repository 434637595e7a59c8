//! `--bf16` / `--fp16` training end to end (SPEC §6.7): half runs track the fp32 run, fp16
//! overflows skip the update and back the loss scale off, half runs resume bit-identically
//! (fp32 main params, Adam state and the scaler in the checkpoint), checkpoints move between
//! fp32 and half runs, and tensor parallelism matches the single-rank half run.

mod common;
use common::*;

/// Mean loss of iterations `from..=to`.
fn mean(losses: &[(u64, f64)], from: u64, to: u64) -> f64 {
    let v: Vec<f64> = losses.iter().filter(|(i, _)| (from..=to).contains(i)).map(|l| l.1).collect();
    v.iter().sum::<f64>() / v.len() as f64
}

/// No dropout: tensor-parallel runs then differ only by summation order.
const BASE: &str = "--train-iters 30 --hidden-dropout 0 --attention-dropout 0";

#[test]
fn bf16_and_fp16_track_fp32() {
    let fp32 = pretrain(&tiny_with(BASE)).unwrap();
    let bf16 = pretrain(&tiny_with(&format!("{BASE} --bf16"))).unwrap();
    let fp16 = pretrain(&tiny_with(&format!("{BASE} --fp16 --initial-loss-scale 4096"))).unwrap();
    let (f, b, h) = (mean(&fp32.losses, 21, 30), mean(&bf16.losses, 21, 30), mean(&fp16.losses, 21, 30));
    // The loss falls from ~4.6 (ln 100) by ~0.5 over 30 steps: a half run that did not train, or
    // trained wrongly, is far outside 2%.
    assert!(f < fp32.losses[0].1 - 0.2, "fp32 did not train: {:?}", fp32.losses);
    for (name, x) in [("bf16", b), ("fp16", h)] {
        assert!(((x - f) / f).abs() < 0.02, "{name} mean loss of 21..30 {x} vs fp32 {f}");
    }
    assert_ne!(bf16.losses, fp32.losses, "bf16 gave the fp32 losses bit for bit: the half path did not run");
}

#[test]
fn fp16_overflow_skips_the_update_and_backs_off() {
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().join("ckpt");
    let save = save.to_str().unwrap();
    // 2^40: the scaled loss gradient overflows fp16 (max 65504) until the scale has halved
    // about 26 times; --hysteresis 1 halves on every overflow.
    let run = pretrain(&tiny_with(&format!(
        "--train-iters 40 --fp16 --initial-loss-scale 1099511627776 --hysteresis 1 --loss-scale-window 1000 \
         --save {save} --save-interval 40"
    )))
    .unwrap();
    let skipped: Vec<u64> = run.grad_norms.iter().filter(|(_, n)| *n == 0.0).map(|(i, _)| *i).collect();
    assert!(skipped.len() >= 10, "expected a run of skipped iterations, got {skipped:?}");
    assert_eq!(skipped, (1..=skipped.len() as u64).collect::<Vec<_>>(), "skips come first, then training");
    assert!(run.losses.iter().all(|l| l.1.is_finite()));
    assert!(mean(&run.losses, 36, 40) < run.losses[0].1 - 0.1, "trains after backing off: {:?}", run.losses);
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("ckpt/iter_0000040/metadata.json")).unwrap())
            .unwrap();
    // The LR schedule stepped only on the applied updates (4 samples each).
    let steps = meta["lr_scheduler"]["num_steps"].as_u64().unwrap();
    assert_eq!(steps, 4 * (40 - skipped.len() as u64), "{}", meta["lr_scheduler"]);
    let scale = meta["optimizer"]["grad_scaler"]["scale"].as_f64().unwrap();
    assert_eq!(scale, 2f64.powi(40 - skipped.len() as i32), "one halving per skipped iteration");
}

/// `first` iterations, save, resume to `total`: the losses equal the straight run's bit for bit.
fn assert_resume_bit_identical(extra: &str) {
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().join("ckpt");
    let save = save.to_str().unwrap();
    let straight = pretrain(&tiny_with(&format!("--train-iters 20 {extra}"))).unwrap();
    let first =
        pretrain(&tiny_with(&format!("--train-iters 20 --exit-interval 10 --save {save} --save-interval 10 {extra}")))
            .unwrap();
    let second =
        pretrain(&tiny_with(&format!("--train-iters 20 --load {save} --save {save} --save-interval 10 {extra}")))
            .unwrap();
    let resumed: Vec<(u64, f64)> = first.losses.iter().chain(&second.losses).cloned().collect();
    assert_eq!(resumed.len(), 20);
    for ((i, a), (_, b)) in straight.losses.iter().zip(&resumed) {
        assert_eq!(a.to_bits(), b.to_bits(), "{extra}: iteration {i}: straight {a} vs resumed {b}");
    }
}

#[test]
fn bf16_resume_is_bit_identical() {
    assert_resume_bit_identical("--bf16");
}

#[test]
fn fp16_resume_with_a_live_scaler_is_bit_identical() {
    // Skips in the first iterations and a growth every 3 clean ones: the scaler state matters.
    assert_resume_bit_identical("--fp16 --initial-loss-scale 1048576 --loss-scale-window 3");
}

#[test]
fn checkpoints_move_between_fp32_and_half_runs() {
    let dir = tempfile::tempdir().unwrap();
    for (from, to) in [("--bf16", ""), ("", "--bf16"), ("--fp16 --initial-loss-scale 4096", "--bf16")] {
        let save = dir.path().join(format!("c{}{}", from.len(), to.len()));
        let save = save.to_str().unwrap();
        let straight = pretrain(&tiny_with(&format!("--train-iters 20 {from}"))).unwrap();
        pretrain(&tiny_with(&format!("--train-iters 20 --exit-interval 10 --save {save} --save-interval 10 {from}")))
            .unwrap();
        let cont = pretrain(&tiny_with(&format!("--train-iters 20 --load {save} {to}"))).unwrap();
        assert_eq!(cont.losses[0].0, 11);
        // The continuation computes in another precision from the same (main) weights and
        // Adam state: it stays within half-precision noise of the straight run.
        let (a, b) = (mean(&straight.losses, 11, 20), mean(&cont.losses, 11, 20));
        assert!(((a - b) / a).abs() < 0.02, "{from:?} -> {to:?}: {b} vs straight {a}");
    }
}

#[test]
fn bf16_tensor_parallel_matches_single_rank() {
    let one = pretrain(&tiny_with(&format!("{BASE} --bf16"))).unwrap();
    let tp2 = pretrain(&tiny_with(&format!("{BASE} --bf16 --nproc 2 --tensor-model-parallel-size 2"))).unwrap();
    // tp2 sums partial products in another order and rounds the partial outputs to bf16 before
    // the all-reduce: the runs part by bf16 rounding (2^-8 relative), not more.
    for ((i, a), (_, b)) in one.losses.iter().zip(&tp2.losses) {
        assert!(((a - b) / a).abs() < 1e-2, "iteration {i}: tp1 {a} vs tp2 {b}");
    }
    let dp2 = pretrain(&tiny_with(&format!("{BASE} --bf16 --nproc 2"))).unwrap();
    for ((i, a), (_, b)) in one.losses.iter().zip(&dp2.losses) {
        assert!(((a - b) / a).abs() < 1e-2, "iteration {i}: dp1 {a} vs dp2 {b}");
    }
}

#[test]
fn hf_export_writes_the_requested_dtype() {
    use megatron::hf::export::{export_dtype, safetensors_bytes_as};
    use megatron_core::DType;
    let args = serde_json::json!({ "bf16": true, "fp16": false });
    assert_eq!(export_dtype(None, &args).unwrap(), DType::BF16, "default: the training dtype");
    assert_eq!(export_dtype(None, &serde_json::json!({ "fp16": true })).unwrap(), DType::F16);
    assert_eq!(export_dtype(None, &serde_json::json!({})).unwrap(), DType::F32);
    assert_eq!(export_dtype(Some("fp32"), &args).unwrap(), DType::F32);
    assert!(export_dtype(Some("int32"), &args).is_err());
    let tensors = vec![("w".to_string(), vec![2], vec![1.0f32 + 1.0 / 512.0, -3.0])];
    for (dtype, want) in [(DType::BF16, safetensors::Dtype::BF16), (DType::F16, safetensors::Dtype::F16)] {
        let bytes = safetensors_bytes_as(&tensors, dtype).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let t = st.tensor("w").unwrap();
        assert_eq!((t.dtype(), t.shape()), (want, &[2usize][..]));
        let v = megatron_core::HostBuffer::from_le_bytes(dtype, t.data()).unwrap().to_f32_vec();
        // 1 + 2^-9 rounds to 1 in bf16 (8 bits), stays in fp16 (11 bits).
        let first = if dtype == DType::BF16 { 1.0 } else { 1.0 + 1.0 / 512.0 };
        assert_eq!(v, vec![first, -3.0], "{dtype}");
    }
}

#[test]
fn half_pipeline_and_distributed_optimizer_match_single_rank() {
    for extra in ["--bf16 --fp32-residual-connection", "--fp16 --initial-loss-scale 4096"] {
        let one = pretrain(&tiny_with(&format!("{BASE} {extra}"))).unwrap();
        for layout in ["--nproc 2 --pipeline-model-parallel-size 2", "--nproc 2 --use-distributed-optimizer"] {
            let other = pretrain(&tiny_with(&format!("{BASE} {extra} {layout}"))).unwrap();
            assert_eq!(other.losses.len(), one.losses.len());
            for ((i, a), (_, b)) in one.losses.iter().zip(&other.losses) {
                assert!(((a - b) / a).abs() < 1e-2, "{extra} {layout}: iteration {i}: {a} vs {b}");
            }
        }
    }
}
