//! `megatron checkpoint convert --load A --save B [--to native|megatron-legacy|hf]
//! [--target-tensor-parallel-size N --target-pipeline-parallel-size M]`.

use super::{detect, Format, TempCheckpoint};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use megatron_checkpoint::CheckpointMeta;
use megatron_checkpoint_megatron::legacy::LegacyCheckpoint;
use megatron_checkpoint_megatron::legacy_write::write_legacy;
use megatron_checkpoint_megatron::native::{host_buffer, model_tensors, native_args, run_state};
use megatron_checkpoint_megatron::partition::Shape;
use megatron_checkpoint_megatron::{TensorData, TorchDType, Value};
use megatron_core::{Backend, DType, ParallelContext, Param, ParamLayout, Registry};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Target {
    /// megatron-rs native (safetensors shards + metadata.json).
    Native,
    /// Megatron-LM's legacy torch format (iter_N/mp_rank_XX[_YYY]/model_optim_rng.pt).
    MegatronLegacy,
    /// A Hugging Face model directory (GPT-2 or Llama shaped models).
    Hf,
}

#[derive(Args, Clone, Debug)]
pub struct ConvertArgs {
    /// Source checkpoint directory (its format is detected).
    #[arg(long)]
    pub load: PathBuf,
    /// Destination directory (`--to hf`: the model directory to create).
    #[arg(long)]
    pub save: PathBuf,
    #[arg(long, value_enum, default_value = "native")]
    pub to: Target,
    /// Tensor-parallel size of a megatron-legacy output (default: the source's, or 1).
    #[arg(long)]
    pub target_tensor_parallel_size: Option<usize>,
    /// Pipeline-parallel size of a megatron-legacy output (default: the source's, or 1).
    #[arg(long)]
    pub target_pipeline_parallel_size: Option<usize>,
    /// Iteration to convert (default: the tracker's).
    #[arg(long)]
    pub ckpt_step: Option<u64>,
}

fn progress(label: &str, quiet: bool) -> impl FnMut(usize, usize) + '_ {
    move |done, total| {
        if !quiet {
            eprint!("\r {label}: shard {done}/{total}");
            if done == total {
                eprintln!();
            }
        }
    }
}

/// Writes `ck` as a native checkpoint under `save`; the vocabulary is padded to
/// `padded_vocab` rows (default: as stored). Returns the iteration directory.
pub fn legacy_to_native(
    ck: &LegacyCheckpoint,
    save: &Path,
    padded_vocab: Option<usize>,
    verbose: bool,
) -> Result<PathBuf> {
    let padded = padded_vocab.unwrap_or(ck.shape.padded_vocab);
    let tensors = model_tensors(ck, padded, &mut progress("reading", !verbose))?;
    let state = run_state(ck, padded);
    let backend = megatron_cpu::CpuBackend::new();
    let mut params = Vec::with_capacity(tensors.len());
    for (name, t) in &tensors {
        let value = backend.from_host(host_buffer(t), &t.shape)?;
        let grad = backend.zeros(&[0], DType::F32)?;
        params.push(Param {
            name: name.clone(),
            value,
            grad,
            layout: ParamLayout::replicated(&t.shape, t.shape.len() == 1),
        });
    }
    let meta = CheckpointMeta {
        consumed_train_samples: state.consumed_train_samples,
        skipped_train_samples: state.skipped_train_samples,
        consumed_valid_samples: state.consumed_valid_samples,
        args: state.args,
        lr_scheduler: state.lr_scheduler,
        rng: state.seed.map_or(serde_json::Value::Null, |s| json!({ "seed": s })),
        tokenizer_fingerprint: None,
        num_floating_point_operations_so_far: state.num_floating_point_operations_so_far,
    };
    let refs: Vec<&Param> = params.iter().collect();
    megatron_checkpoint::save(save, state.iteration, &refs, None, meta, &backend, &ParallelContext::single())
        .with_context(|| format!("writing the converted checkpoint to {}", save.display()))
}

pub fn run(a: &ConvertArgs, registry: &Registry) -> Result<()> {
    let format = detect(&a.load)
        .with_context(|| format!("{} holds no checkpoint (no latest_checkpointed_iteration.txt)", a.load.display()))?;
    match (format, a.to) {
        (Format::TorchDist, _) => bail!("{}: reading torch_dist checkpoints is not implemented yet", a.load.display()),
        (Format::MegatronLegacy, Target::Native) => {
            let ck = megatron_checkpoint_megatron::legacy::open(&a.load, a.ckpt_step)?;
            let path = legacy_to_native(&ck, &a.save, None, true)?;
            println!(
                "converted Megatron-LM legacy tp{} x pp{} iteration {} to {}",
                ck.shape.tp,
                ck.shape.pp,
                ck.iteration(),
                path.display()
            );
            Ok(())
        }
        (Format::Native, Target::Native) => bail!("{} is already a native checkpoint", a.load.display()),
        (Format::MegatronLegacy, Target::Hf) => {
            let ck = megatron_checkpoint_megatron::legacy::open(&a.load, a.ckpt_step)?;
            let tmp = TempCheckpoint(a.save.with_extension(format!("native-tmp-{}", std::process::id())));
            legacy_to_native(&ck, &tmp.0, None, true)?;
            export_hf(&tmp.0, None, &a.save, registry)
        }
        (Format::Native, Target::Hf) => export_hf(&a.load, a.ckpt_step, &a.save, registry),
        (Format::MegatronLegacy, Target::MegatronLegacy) => {
            let ck = megatron_checkpoint_megatron::legacy::open(&a.load, a.ckpt_step)?;
            let tensors = ck.full_tensors(&mut progress("reading", false))?;
            let args = native_args(&ck.args, ck.shape.padded_vocab);
            let sched = ck.scheduler_state().map(|v| v.to_json()).unwrap_or_default();
            write_megatron(a, ck.iteration(), &tensors, &args, &sched)
        }
        (Format::Native, Target::MegatronLegacy) => {
            let ck = megatron_checkpoint::load(&a.load, a.ckpt_step)?;
            let mut tensors = BTreeMap::new();
            for name in ck.tensor_names().filter(|n| !n.starts_with(megatron_checkpoint::metadata::OPTIMIZER_PREFIX)) {
                let (data, shape) = ck.tensor(name)?;
                tensors.insert(name.to_string(), tensor_data(data, shape));
            }
            let mut args = ck.metadata.meta.args.clone();
            if let (Some(m), Some(w)) = (args.as_object_mut(), tensors.get("embedding.word_embeddings.weight")) {
                m.insert("padded_vocab_size".into(), json!(w.shape[0]));
            }
            write_megatron(a, ck.iteration(), &tensors, &args, &ck.metadata.meta.lr_scheduler)
        }
    }
}

fn tensor_data(data: megatron_core::HostBuffer, shape: Vec<usize>) -> TensorData {
    use megatron_core::HostBuffer as H;
    let (dtype, bytes) = match data {
        H::BF16(v) => (TorchDType::BF16, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        H::F16(v) => (TorchDType::F16, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        other => (TorchDType::F32, other.to_f32_vec().iter().flat_map(|x| x.to_le_bytes()).collect()),
    };
    TensorData { dtype, shape, bytes }
}

/// Writes full tensors as a legacy checkpoint at the target tp/pp (default: as the source).
fn write_megatron(
    a: &ConvertArgs,
    iteration: u64,
    tensors: &BTreeMap<String, TensorData>,
    args: &serde_json::Value,
    sched: &serde_json::Value,
) -> Result<()> {
    let source = Shape::from_args(&Value::from_json(args), &a.load)?;
    let tp = a.target_tensor_parallel_size.unwrap_or(source.tp);
    let pp = a.target_pipeline_parallel_size.unwrap_or(source.pp);
    if tp == 0 || pp == 0 {
        bail!("--target-tensor-parallel-size and --target-pipeline-parallel-size must be >= 1");
    }
    // Megatron's padding rule for the target tp (the padding only grows: the true vocabulary
    // size is not always known).
    let m = args["make_vocab_size_divisible_by"].as_u64().unwrap_or(128).max(1) as usize * tp;
    let padded = source.padded_vocab.div_ceil(m) * m;
    let mut target = Shape { tp, pp, vp: 1, padded_vocab: padded, ..source };
    target.first_stage_layers = None;
    target.last_stage_layers = None;
    let mut check = args.clone();
    if let Some(o) = check.as_object_mut() {
        o.insert("tensor_model_parallel_size".into(), json!(tp));
        o.insert("pipeline_model_parallel_size".into(), json!(pp));
        o.insert("padded_vocab_size".into(), json!(padded));
        o.insert("virtual_pipeline_model_parallel_size".into(), serde_json::Value::Null);
        o.insert("decoder_first_pipeline_num_layers".into(), serde_json::Value::Null);
        o.insert("decoder_last_pipeline_num_layers".into(), serde_json::Value::Null);
    }
    Shape::from_args(&Value::from_json(&check), &a.save)
        .with_context(|| format!("target layout tp{tp} x pp{pp} does not fit the model"))?;
    let dir = write_legacy(&a.save, iteration, tensors, &target, &check, sched, &mut progress("writing", false))?;
    println!("wrote Megatron-LM legacy tp{tp} x pp{pp} iteration {iteration} to {}", dir.display());
    Ok(())
}

fn export_hf(native: &Path, step: Option<u64>, out: &Path, registry: &Registry) -> Result<()> {
    let load = crate::generate::LoadArgs { load: native.to_path_buf(), ckpt_step: step, ..Default::default() };
    let load = crate::generate::LoadArgs { backend: "cpu".into(), ..load };
    crate::hf::export::run(&crate::hf::export::ExportHfArgs { load, out: out.to_path_buf(), dtype: None }, registry)
}
