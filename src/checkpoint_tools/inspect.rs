//! `megatron checkpoint inspect DIR`: format, iteration, the args that shape the model, every
//! tensor (full size, after reassembling tp/pp shards) with shape, dtype and L2 norm, and what
//! the optimizer state holds.

use super::{detect, Format};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Clone, Debug)]
pub struct InspectArgs {
    /// Checkpoint directory (Megatron-LM legacy torch, or megatron-rs native).
    pub dir: PathBuf,
    /// Iteration (default: the tracker's).
    #[arg(long)]
    pub ckpt_step: Option<u64>,
}

const SHAPE_KEYS: [&str; 14] = [
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "seq_length",
    "max_position_embeddings",
    "padded_vocab_size",
    "swiglu",
    "normalization",
    "position_embedding_type",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
];

fn norm(v: &[f32]) -> f64 {
    v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt()
}

pub fn run(a: &InspectArgs) -> Result<()> {
    match detect(&a.dir) {
        Some(Format::MegatronLegacy) => {
            let ck = megatron_checkpoint_megatron::legacy::open(&a.dir, a.ckpt_step)?;
            println!("format: Megatron-LM legacy torch (checkpoint_version {})", ck.checkpoint_version());
            println!("directory: {}", ck.iter_dir.display());
            println!("iteration: {}", ck.iteration());
            println!("parallel: tp{} x pp{} (virtual chunks {})", ck.shape.tp, ck.shape.pp, ck.shape.vp);
            let args = ck.args.to_json();
            for k in SHAPE_KEYS {
                println!("args.{k}: {}", args[k]);
            }
            if let Some(s) = ck.scheduler_state() {
                println!("opt_param_scheduler: {}", s.to_json());
            }
            println!("optimizer: {}", ck.optimizer_summary());
            let tensors = ck.full_tensors(&mut |done, total| {
                eprint!("\r reading shard {done}/{total}");
                if done == total {
                    eprintln!();
                }
            })?;
            println!("tensors ({}, reassembled to tp1 x pp1):", tensors.len());
            for (name, t) in &tensors {
                println!("  {name:60} {:>14} {:?} norm {:.6}", t.dtype.name(), t.shape, norm(&t.to_f32()));
            }
            Ok(())
        }
        Some(Format::Native) => {
            let ck = megatron_checkpoint::load(&a.dir, a.ckpt_step)?;
            let m = &ck.metadata;
            println!("format: megatron-rs native (version {})", m.format_version);
            println!("directory: {}", ck.dir().display());
            println!("iteration: {}", m.iteration);
            println!("saved with: tp{} x pp{} x dp{}", m.parallel.tp, m.parallel.pp, m.parallel.dp);
            for k in SHAPE_KEYS {
                println!("args.{k}: {}", m.meta.args[k]);
            }
            println!("lr_scheduler: {}", m.meta.lr_scheduler);
            println!(
                "optimizer: {}",
                if m.optimizer_saved { format!("present ({})", m.optimizer) } else { "none".to_string() }
            );
            println!("tensors ({}):", m.tensors.len());
            for (name, e) in &m.tensors {
                let (data, shape) = ck.tensor(name).with_context(|| format!("reading `{name}`"))?;
                println!("  {name:60} {:>14} {shape:?} norm {:.6}", e.dtype, norm(&data.to_f32_vec()));
            }
            Ok(())
        }
        Some(Format::TorchDist) => {
            let ck = megatron_checkpoint_megatron::dist::open(&a.dir, a.ckpt_step)?;
            println!("format: Megatron-Core torch_dist (torch.distributed.checkpoint)");
            println!("directory: {}", ck.iter_dir.display());
            println!("iteration: {}", ck.iteration());
            let args = ck.args.to_json();
            for k in SHAPE_KEYS {
                println!("args.{k}: {}", args[k]);
            }
            if let Some(s) = ck.scheduler_state() {
                println!("opt_param_scheduler: {}", s.to_json());
            }
            let optim = ck.tensors.keys().filter(|k| k.starts_with("optimizer.")).count();
            println!("optimizer: {optim} sharded tensors (not converted by megatron-rs)");
            println!("stored keys ({}):", ck.tensors.len());
            for (k, t) in &ck.tensors {
                println!("  {k:60} {:>10} {:?} in {} chunks", t.dtype.name(), t.size, t.chunks.len());
            }
            let tensors = ck.full_tensors(&mut |done, total| {
                eprint!("\r reading key {done}/{total}");
                if done == total {
                    eprintln!();
                }
            })?;
            println!("tensors ({}, unstacked):", tensors.len());
            for (name, t) in &tensors {
                println!("  {name:60} {:>14} {:?} norm {:.6}", t.dtype.name(), t.shape, norm(&t.to_f32()));
            }
            Ok(())
        }
        None => bail!("{} holds no checkpoint (no latest_checkpointed_iteration.txt)", a.dir.display()),
    }
}
