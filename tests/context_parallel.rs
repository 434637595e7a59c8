//! `--context-parallel-size` (SPEC §5.9) through `megatron pretrain`: the tiny GPT at seq 256
//! for 20 steps (fp32, no dropout) at cp2 and cp2·tp2 (also with sequence parallelism)
//! matches the single-rank run (losses and grad norms within 1e-5 relative); cp2·dp2 reduces
//! the gradients over DP×CP; the unsupported combinations are refused with their fix.

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
