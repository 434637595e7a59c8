//! `--sequence-parallel` in bf16 / fp16 (SPEC §5.3, §6.7), one training microbatch at tp = 2
//! (two ranks as threads): the sequence-parallel model against the same tp = 2 model without
//! SP, both half.
//!
//! The SP gathers / reduce-scatters move the model's dtype, and the half partial sums of the
//! row-parallel layers are rounded where the plain TP all-reduce rounds them (the communicator
//! adds half inputs in fp32 in rank order and rounds once, for all-reduce and reduce-scatter
//! alike); every gemm sees the same gathered rows and norms / residual adds are per token. So
//! the loss and the gradient of every TP-split parameter must be **bit-identical**. Only the
//! TP-replicated parameters (norm weights/biases, row-parallel biases) sum their fp32 gradient
//! in another order (each shard's tokens, then the TP all-reduce in `finalize_grads`): they
//! must agree to fp32 rounding of a sum over 32 tokens, asserted ≤ 1e-5 of the largest element.

mod common;

use common::*;
use megatron_comm_local::LocalCommunicator;
use megatron_core::{Batch, DType, HostBuffer, LossReport, Mode, Model, ParallelContext, RankGrid};
use megatron_gpt::{GptConfig, GptModel};

/// One rank's loss and `(name, tp_axis, grad)` of every parameter.
type Grads = (LossReport, Vec<(String, Option<usize>, Vec<f32>)>);

fn run(config: GptConfig, ctx: ParallelContext, batch: &Batch) -> Grads {
    let mut model = GptModel::new(config, backend(), ctx).unwrap();
    let bk = model.backend();
    // Biases and norm weights start at 0 / 1; move them off their init (the same on both
    // layouts; replicated ones equal on every rank, split ones by their rank and local index)
    // so a dropped bias or a norm applied to the wrong rows changes the loss.
    for p in model.params_mut().into_iter().filter(|p| p.value.shape().len() == 1) {
        let rank = if p.layout.tp_axis.is_some() { p.layout.tp_rank } else { 0 };
        let mut v = bk.to_host(&p.value).unwrap().to_f32_vec();
        v.iter_mut().enumerate().for_each(|(i, x)| *x += 0.05 * ((i * 7 + rank * 3) % 11) as f32 - 0.25);
        let wide = bk.from_host(HostBuffer::F32(v), p.value.shape()).unwrap();
        bk.cast(&wide, &mut p.value).unwrap();
    }
    model.zero_grad().unwrap();
    let report = model.forward(batch, Mode::Train).unwrap();
    model.backward(1.0).unwrap();
    model.finalize_grads().unwrap();
    let grads = model
        .params()
        .iter()
        .map(|p| (p.name.clone(), p.layout.tp_axis, bk.to_host(&p.grad).unwrap().to_f32_vec()))
        .collect();
    (report, grads)
}

fn tp2(config: &GptConfig, batch: &Batch) -> Vec<Grads> {
    let grid = RankGrid::new(2, 2, 1, 1).unwrap();
    let comms = LocalCommunicator::world(2, std::time::Duration::from_secs(60));
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, comm)| {
                let (cfg, ctx) = (config.clone(), grid.context(r, comm.clone()));
                s.spawn(move || run(cfg, ctx, batch))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn check(mut config: GptConfig, dtype: DType, fp32_residual: bool) {
    config.params_dtype = dtype;
    config.fp32_residual_connection = fp32_residual;
    let what = format!(
        "{dtype} fp32-residual={fp32_residual} {} {:?} bias={}",
        config.position_embedding_type, config.normalization, config.add_bias_linear
    );
    let batch = batch(2, 16, config.vocab_size, 5);
    let plain = tp2(&config, &batch);
    config.sequence_parallel = true;
    let sp = tp2(&config, &batch);
    let mut worst = (String::new(), 0f64);
    for (rank, (p, s)) in plain.iter().zip(&sp).enumerate() {
        assert_eq!(p.0.loss_sum.to_bits(), s.0.loss_sum.to_bits(), "[{what}] rank {rank}: loss");
        for ((name, axis, g_plain), (name_sp, _, g_sp)) in p.1.iter().zip(&s.1) {
            assert_eq!(name, name_sp);
            if axis.is_some() {
                assert!(g_plain == g_sp, "[{what}] rank {rank}: gradient of TP-split {name} must be bit-identical");
                continue;
            }
            let max = g_plain.iter().fold(1e-30f64, |m, &x| m.max(x.abs() as f64));
            let err = g_plain.iter().zip(g_sp).fold(0f64, |m, (&a, &b)| m.max((a as f64 - b as f64).abs())) / max;
            if err > worst.1 {
                worst = (name.clone(), err);
            }
            assert!(err <= 1e-5, "[{what}] rank {rank}: gradient of replicated {name}: SP vs no SP {err:.3e}");
        }
    }
    println!(
        "[{what}] loss and TP-split gradients bit-identical; worst replicated gradient {} {:.3e}",
        worst.0, worst.1
    );
}

#[test]
fn half_sequence_parallel_equals_plain_tensor_parallel() {
    for dtype in [DType::BF16, DType::F16] {
        check(tiny_config(64, 16), dtype, false);
        // RoPE (no position table: the embedding is reduce-scattered directly), RMSNorm,
        // SwiGLU, GQA, untied head; then with linear biases (row-parallel biases replicated).
        let mut llama = tiny_llama_config(64, 16);
        check(llama.clone(), dtype, false);
        llama.add_bias_linear = true;
        check(llama, dtype, false);
    }
    // fp32 residual stream in a bf16 model: the SP shards of the stream, the embedding's
    // reduce-scatter and the lm-head gather of the (bf16) final norm output mix dtypes.
    check(tiny_config(64, 16), DType::BF16, true);
}
