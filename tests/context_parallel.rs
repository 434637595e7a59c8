//! `--context-parallel-size` (SPEC §5.9) through `megatron pretrain`: the tiny GPT at seq 256
//! for 20 steps (fp32, no dropout) at cp2 and cp2·tp2 (also with sequence parallelism)
//! matches the single-rank run (losses and grad norms within 1e-5 relative); cp2·dp2 reduces
//! the gradients over DP×CP; bf16/fp16 at cp2 and cp2·tp2 match the single-rank run in the same
//! precision (within the half type's unit roundoff); the unsupported combinations are refused
//! with their fix.

mod common;
use common::*;

/// Tiny GPT at seq 256, 20 iterations, global batch 2 (vocab 128 stays unpadded up to tp 2).
fn cp_flags(extra: &str) -> Vec<String> {
    tiny_with(&format!(
        "--seq-length 256 --max-position-embeddings 256 --micro-batch-size 1 --vocab-size 128 \
         --make-vocab-size-divisible-by 64 --hidden-dropout 0 --attention-dropout 0 --global-batch-size 2 \
         --train-iters 20 --eval-interval 20 --eval-iters 1 --log-interval 10 {extra}"
    ))
}

#[test]
fn context_parallel_matches_the_single_rank_run() {
    let reference = pretrain(&cp_flags("")).unwrap();
    assert_eq!(reference.losses.len(), 20);
    let cases = [
        "--nproc 2 --context-parallel-size 2",
        "--nproc 4 --context-parallel-size 2 --tensor-model-parallel-size 2",
        "--nproc 4 --context-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel",
        "--nproc 4 --context-parallel-size 2 --use-distributed-optimizer",
    ];
    for case in cases {
        let run = pretrain(&cp_flags(case)).unwrap_or_else(|e| panic!("[{case}]: {e:#}"));
        let (loss, norm) = (max_rel(&run.losses, &reference.losses), max_rel(&run.grad_norms, &reference.grad_norms));
        println!("CP [{case}]: max rel diff loss {loss:.2e}, grad norm {norm:.2e}");
        assert!(loss < 1e-5 && norm < 1e-5, "[{case}]: loss {loss:.2e}, grad norm {norm:.2e}");
    }
}

/// Llama-style (rotary positions rotated at each chunk's global offset, GQA, RMSNorm, SwiGLU,
/// no biases, untied output) at cp2·tp2 with sequence parallelism.
#[test]
fn context_parallel_with_rotary_matches_the_single_rank_run() {
    let llama = "--position-embedding-type rope --group-query-attention --num-query-groups 2 --normalization \
                 RMSNorm --swiglu --disable-bias-linear --untie-embeddings-and-output-weights";
    let reference = pretrain(&cp_flags(llama)).unwrap();
    let case = "--nproc 4 --context-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel";
    let run = pretrain(&cp_flags(&format!("{llama} {case}"))).unwrap();
    let (loss, norm) = (max_rel(&run.losses, &reference.losses), max_rel(&run.grad_norms, &reference.grad_norms));
    println!("CP llama [{case}]: max rel diff loss {loss:.2e}, grad norm {norm:.2e}");
    assert!(loss < 1e-5 && norm < 1e-5, "[{case}] llama: loss {loss:.2e}, grad norm {norm:.2e}");
}

/// bf16 and fp16 (dynamic loss scaler from 2^12) at cp2, cp2·tp2 and cp2·tp2 with
/// `--sequence-parallel` against the single-rank run
/// in the same precision, and the Llama-style GPT (rotary per chunk at its global offset, GQA)
/// in bf16 at cp2·tp2.
///
/// Tolerances, with `u` the unit roundoff of the half type (bf16 2^-8, fp16 2^-11): losses
/// `u/16`, grad norms `4u`. CP changes only the f32 summation order inside the attention (blocks
/// merged by log-sum-exp; TP adds its own reduction order), so a half activation differs from the
/// single-rank one by one rounding (≤ u relative) where an f32 result lies near a rounding
/// boundary, and these flips carry through the 20 Adam steps. The loss averages 512 token losses
/// per iteration whose perturbations have both signs (≈ u/√512 ≈ u/22 for one flip per token),
/// hence u/16. A grad norm averages less: tp2 alone, no CP, is 3.5e-3 ≈ 0.9u off the single-rank
/// bf16 run here, hence 4u. Measured (bf16 / fp16): cp2 loss 2.0e-5 / 3.5e-6, norm 1.1e-3 /
/// 2.8e-4; cp2·tp2 3.0e-5 / 5.6e-6, 3.8e-3 / 3.1e-4; llama cp2·tp2 bf16 5.6e-5, 1.0e-4. A wrong
/// chunk (a K/V block masked at another rank's positions) gives loss 9.2e-4 and norm 0.32. The
/// ring's own rounding (one rounding per result, f32 merge, f32 dK/dV) is checked bitwise in
/// `models/gpt/tests/ring_attention_half.rs`, which catches what these averages cannot; fp32
/// keeps 1e-5 above.
#[test]
fn context_parallel_in_half_precision_matches_the_single_rank_run() {
    let llama = "--position-embedding-type rope --group-query-attention --num-query-groups 2 --normalization \
                 RMSNorm --swiglu --disable-bias-linear --untie-embeddings-and-output-weights";
    let bf16 = ("--bf16", 2f64.powi(-8));
    let fp16 = ("--fp16 --initial-loss-scale 4096", 2f64.powi(-11));
    let cp2 = "--nproc 2 --context-parallel-size 2";
    let cp2tp2 = "--nproc 4 --context-parallel-size 2 --tensor-model-parallel-size 2";
    let cp2tp2sp = "--nproc 4 --context-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel";
    let runs =
        [(bf16, "", vec![cp2, cp2tp2, cp2tp2sp]), (fp16, "", vec![cp2, cp2tp2, cp2tp2sp]), (bf16, llama, vec![cp2tp2])];
    for ((precision, u), model, cases) in runs {
        let reference = pretrain(&cp_flags(&format!("{precision} {model}"))).unwrap();
        assert_eq!(reference.losses.len(), 20);
        for case in cases {
            let name = format!("{precision}{} {case}", if model.is_empty() { "" } else { " llama" });
            let run = pretrain(&cp_flags(&format!("{precision} {model} {case}")))
                .unwrap_or_else(|e| panic!("[{name}]: {e:#}"));
            let (loss, norm) =
                (max_rel(&run.losses, &reference.losses), max_rel(&run.grad_norms, &reference.grad_norms));
            println!("CP [{name}]: max rel diff loss {loss:.2e}, grad norm {norm:.2e} (u {u:.1e})");
            assert!(loss < u / 16.0 && norm < 4.0 * u, "[{name}]: loss {loss:.2e}, grad norm {norm:.2e} vs u {u:.1e}");
        }
    }
}

/// A checkpoint saved at cp2·tp2 resumes at cp1 on the uninterrupted trajectory.
#[test]
fn context_parallel_checkpoint_resumes_without_it() {
    let straight = pretrain(&cp_flags("")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let ckpt = ckpt.to_str().unwrap();
    let save = "--nproc 4 --context-parallel-size 2 --tensor-model-parallel-size 2";
    pretrain(&cp_flags(&format!("{save} --exit-interval 10 --save {ckpt} --save-interval 10"))).unwrap();
    let second = pretrain(&cp_flags(&format!("--load {ckpt}"))).unwrap();
    assert_eq!(second.losses.first().map(|l| l.0), Some(11), "resume starts at iteration 11");
    let diff = max_rel(&second.losses, &straight.losses[10..]);
    println!("save [{save}] -> load [cp1]: max relative loss diff {diff:.2e}");
    assert!(diff < 1e-5, "save [{save}] -> load [cp1]: {diff:.2e}");
}

#[test]
fn context_parallel_refuses_what_it_cannot_run() {
    let err = |extra: &str| match pretrain(&cp_flags(extra)) {
        Ok(_) => panic!("[{extra}] must be refused"),
        Err(e) => e.to_string(),
    };
    let e = err("--nproc 2 --context-parallel-size 2 --seq-length 250 --max-position-embeddings 256");
    assert!(e.contains("divisible by 4"), "{e}");
    let e = err("--nproc 2 --context-parallel-size 2 --attention-dropout 0.1");
    assert!(e.contains("--attention-dropout 0"), "{e}");
    let e = err("--nproc 3 --context-parallel-size 2");
    assert!(e.contains("--context-parallel-size 2"), "{e}");
}
