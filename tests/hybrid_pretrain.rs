//! `megatron pretrain --model hybrid|mamba` end to end on mock data (issue 18): the loss
//! falls, data, tensor and pipeline parallelism (ranks as threads, dropout off as in
//! tests/parallel_parity.rs) match the single rank, a resumed run is
//! bit-identical, and a pattern of the wrong length is a clear error.

mod common;
use common::*;

const HYBRID: &str = "--hidden-dropout 0 --attention-dropout 0 --model hybrid --num-layers 4 --hybrid-layer-pattern M*-M --normalization RMSNorm \
    --mamba-state-dim 8 --mamba-head-dim 8 --mamba-num-groups 2 --mamba-chunk-size 5";

#[test]
fn hybrid_pretrain_learns_and_dp_matches_one_rank() {
    let one = pretrain(&tiny_with(&format!("{HYBRID} --train-iters 12"))).unwrap();
    let (first, last) = (one.losses[0].1, one.losses[11].1);
    assert!(last.is_finite() && last < first - 0.1, "loss {first} -> {last}");
    let dp2 = pretrain(&tiny_with(&format!("{HYBRID} --train-iters 12 --nproc 2"))).unwrap();
    for ((i, a), (_, b)) in one.losses.iter().zip(&dp2.losses) {
        assert!((a - b).abs() < 1e-5 * a.abs(), "iteration {i}: one rank {a} vs dp2 {b}");
    }
}

#[test]
fn hybrid_pretrain_tp2_and_pp2_match_one_rank() {
    let base = format!("{HYBRID} --train-iters 6");
    let one = pretrain(&tiny_with(&base)).unwrap();
    for par in [
        "--tensor-model-parallel-size 2 --nproc 2",
        "--pipeline-model-parallel-size 2 --nproc 2 --hybrid-layer-pattern M*|-M",
    ] {
        let run = pretrain(&tiny_with(&format!("{base} {par}"))).unwrap();
        assert_eq!(run.losses.len(), one.losses.len(), "{par}");
        for ((i, a), (_, b)) in one.losses.iter().zip(&run.losses) {
            assert!((a - b).abs() < 1e-5 * a.abs(), "{par}: iteration {i}: one rank {a} vs {b}");
        }
    }
}

#[test]
fn mamba_resume_is_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().join("ckpt");
    let save = save.to_str().unwrap();
    let m = "--model mamba --num-layers 2 --normalization RMSNorm --mamba-state-dim 8 --mamba-head-dim 8 \
             --mamba-num-groups 1 --mamba-chunk-size 4 --train-iters 8";
    let straight = pretrain(&tiny_with(m)).unwrap();
    let first = pretrain(&tiny_with(&format!("{m} --exit-interval 4 --save {save} --save-interval 4"))).unwrap();
    let second = pretrain(&tiny_with(&format!("{m} --load {save} --save {save} --save-interval 4"))).unwrap();
    let resumed: Vec<(u64, f64)> = first.losses.iter().chain(&second.losses).cloned().collect();
    assert_eq!(resumed.len(), 8);
    for ((i, a), (_, b)) in straight.losses.iter().zip(&resumed) {
        assert_eq!(a.to_bits(), b.to_bits(), "iteration {i}: straight {a} vs resumed {b}");
    }
}

#[test]
fn pattern_length_must_match_num_layers() {
    let e =
        pretrain(&tiny_with("--model hybrid --num-layers 2 --hybrid-layer-pattern M*- --train-iters 1")).err().unwrap();
    assert!(format!("{e:#}").contains("--hybrid-layer-pattern `M*-` has 3 layer symbols"), "{e:#}");
}

#[test]
fn ratios_allocate_the_pattern_and_must_agree_with_an_explicit_one() {
    let auto = "--model hybrid --num-layers 4 --hybrid-attention-ratio 0.25 --hybrid-mlp-ratio 0.25 \
                --mamba-state-dim 8 --mamba-head-dim 8 --mamba-num-groups 2 --train-iters 4 --lr-warmup-iters 1";
    pretrain(&tiny_with(auto)).unwrap();
    let e = pretrain(&tiny_with(&format!("{auto} --hybrid-layer-pattern MMM*"))).err().unwrap();
    assert!(format!("{e:#}").contains("attention/MLP counts"), "{e:#}");
}

/// `E` layers of the pattern take the MoE plugin's module (`--features moe` links it, or
/// `--plugin libmegatron_moe.so`) when `--num-experts` is set; without it, an error naming the plugin.
#[test]
fn e_layers_need_the_moe_plugin() {
    let base = "--hidden-dropout 0 --attention-dropout 0 --model hybrid --num-layers 3 --hybrid-layer-pattern M*E \
        --normalization RMSNorm --mamba-state-dim 8 --mamba-head-dim 8 --mamba-num-groups 2 --mamba-chunk-size 5";
    let e = pretrain(&tiny_with(&format!("{base} --train-iters 1"))).err().unwrap();
    assert!(format!("{e:#}").contains("--plugin libmegatron_moe.so"), "{e:#}");
    #[cfg(feature = "moe")]
    {
        let run =
            pretrain(&tiny_with(&format!("{base} --train-iters 12 --num-experts 4 --moe-router-topk 2"))).unwrap();
        let (first, last) = (run.losses[0].1, run.losses[11].1);
        assert!(last.is_finite() && last < first - 0.1, "loss {first} -> {last}");
    }
}
