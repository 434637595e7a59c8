//! Per-rank activation memory of one training forward, counted exactly: the bytes of every
//! tensor the decoder keeps for backward (`TransformerBlock::saved_activations_mut`: residual
//! stream, norm outputs and statistics, qkv, context, log-sum-exp, MLP activations), for a GPT
//! of the given shape under tensor / sequence / context parallelism (ranks as threads).
//!
//! `cargo run --release -p megatron-gpt --example activation_memory -- LAYERS SEQ MBS TP CP SP [DTYPE]`
//! e.g. `-- 12 1024 1 2 1 1` is GPT-2 124M at seq 1024, tp2 with sequence parallelism; DTYPE is
//! `fp32` (default), `bf16` or `fp16` (the `--bf16` / `--fp16` model: half activations).
//! Prints one line per rank; scripts/sp_cp_memory.sh runs the comparisons.

use megatron_comm_local::LocalCommunicator;
use megatron_core::{Backend, Batch, Mode, Model, RankGrid};
use megatron_cpu::CpuBackend;
use megatron_gpt::{GptConfig, GptModel};
use std::sync::Arc;

fn main() -> anyhow::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: activation_memory LAYERS SEQ MBS TP CP SP(0|1) [fp32|bf16|fp16]";
    let dtype = match args.len() {
        7 => match args.pop().as_deref() {
            Some("fp32") => megatron_core::DType::F32,
            Some("bf16") => megatron_core::DType::BF16,
            Some("fp16") => megatron_core::DType::F16,
            _ => anyhow::bail!("{usage}"),
        },
        6 => megatron_core::DType::F32,
        _ => anyhow::bail!("{usage}"),
    };
    let args: Vec<usize> = args.iter().map(|a| a.parse()).collect::<Result<_, _>>()?;
    let [layers, seq, mbs, tp, cp, sp] = args[..] else {
        anyhow::bail!("{usage}");
    };
    let mut c = GptConfig::new(layers, 768, 12, seq, 50257);
    c.max_position_embeddings = seq;
    c.hidden_dropout = 0.0;
    c.attention_dropout = 0.0;
    c.sequence_parallel = sp == 1;
    c.params_dtype = dtype;
    let n = mbs * seq;
    let tokens: Vec<i32> = (0..n).map(|i| (i * 7919 % 50257) as i32).collect();
    let batch = Batch {
        micro_batch_size: mbs,
        seq_length: seq,
        labels: tokens.iter().map(|t| (t + 1) % 50257).collect(),
        tokens,
        loss_mask: vec![1.0; n],
        seed: 1,
    };
    let world = tp * cp;
    let grid = RankGrid::new(world, tp, cp, 1)?;
    let comms = LocalCommunicator::world(world, std::time::Duration::from_secs(600));
    let lines: Vec<anyhow::Result<String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|r| {
                let (c, ctx, batch) = (c.clone(), grid.context(r, comms[r].clone()), &batch);
                s.spawn(move || -> anyhow::Result<String> {
                    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new());
                    let mut model = GptModel::new(c, backend, ctx)?;
                    let out = model.forward_stage(0, batch, None, Mode::Train)?;
                    let bytes: usize =
                        model.decoder.saved_activations_mut().iter().map(|t| t.numel() * t.dtype().size()).sum();
                    let loss = match out {
                        megatron_core::StageOutput::Loss(l) => l.loss_sum / l.num_tokens,
                        _ => f64::NAN,
                    };
                    Ok(format!(
                        "rank {r}: decoder saved activations {:.1} MiB, loss {loss:.6}",
                        bytes as f64 / 1048576.0
                    ))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    println!("layers {layers} seq {seq} mbs {mbs} tp {tp} cp {cp} sp {sp} dtype {dtype}");
    for l in lines {
        println!("  {}", l?);
    }
    Ok(())
}
