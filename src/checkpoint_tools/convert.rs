//! `megatron checkpoint convert --load A --save B [--to native|megatron-legacy|hf]
//! [--target-tensor-parallel-size N --target-pipeline-parallel-size M]`.

use super::{detect, Format, TempCheckpoint};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use megatron_checkpoint::CheckpointMeta;
use megatron_checkpoint_megatron::dist::DistCheckpoint;
use megatron_checkpoint_megatron::legacy::LegacyCheckpoint;
use megatron_checkpoint_megatron::legacy_write::{write_legacy, OptimizerOut};
use megatron_checkpoint_megatron::native::{
    host_buffer, model_tensors, native_args, optimizer_tensors, repad, run_state, run_state_from, RunState,
};
use megatron_checkpoint_megatron::optim_read::{read_optimizer, FullOptimizerState};
use megatron_checkpoint_megatron::optim_write::GroupHyper;
use megatron_checkpoint_megatron::partition::Shape;
use megatron_checkpoint_megatron::{TensorData, TorchDType, Value};
use megatron_core::{DType, MemoryOps, OptimizerState, ParallelContext, Param, ParamLayout, Registry};
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
    /// Leave the optimizer state out of a megatron-legacy output (it is kept by default).
    #[arg(long)]
    pub no_save_optim: bool,
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
    write_native(&tensors, state, read_optimizer(ck)?.as_ref(), padded, save, verbose)
}

/// Writes a Megatron-Core `torch_dist` checkpoint as a native one (model weights and run
/// state; its optimizer state is not read).
pub fn dist_to_native(ck: &DistCheckpoint, save: &Path, padded_vocab: Option<usize>, verbose: bool) -> Result<PathBuf> {
    let padded = padded_vocab.unwrap_or(ck.shape.padded_vocab);
    let tensors = repad(ck.full_tensors(&mut progress("reading", !verbose))?, padded)?;
    let state = run_state_from(&ck.args, ck.iteration(), &ck.common, padded);
    write_native(&tensors, state, None, padded, save, verbose)
}

/// Writes full tensors, run state and (Megatron's) optimizer state as a native checkpoint.
fn write_native(
    tensors: &BTreeMap<String, TensorData>,
    state: RunState,
    optim: Option<&FullOptimizerState>,
    padded: usize,
    save: &Path,
    verbose: bool,
) -> Result<PathBuf> {
    let backend = megatron_cpu::CpuBackend::new();
    let mut params = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
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
    // Megatron's Adam state (and fp32 main params), under megatron-rs's per-parameter names.
    let optimizer = match optim {
        Some(full) => {
            let mut tensors = Vec::new();
            for (key, t) in optimizer_tensors(full, padded)? {
                tensors.push((key, backend.from_host(host_buffer(&t), &t.shape)?));
            }
            let mut scalars = json!({ "step": full.step });
            if let Some(gs) = &full.grad_scaler {
                scalars["grad_scaler"] = gs.clone();
            }
            if verbose {
                println!(" optimizer state: Adam step {}, {} tensors", full.step, tensors.len());
            }
            Some(OptimizerState { scalars, tensors })
        }
        None => None,
    };
    let refs: Vec<&Param> = params.iter().collect();
    megatron_checkpoint::save(save, state.iteration, &refs, optimizer, meta, &backend, &ParallelContext::single())
        .with_context(|| format!("writing the converted checkpoint to {}", save.display()))
}

pub fn run(a: &ConvertArgs, registry: &Registry) -> Result<()> {
    let format = detect(&a.load)
        .with_context(|| format!("{} holds no checkpoint (no latest_checkpointed_iteration.txt)", a.load.display()))?;
    match (format, a.to) {
        (Format::TorchDist, Target::Native) => {
            let ck = megatron_checkpoint_megatron::dist::open(&a.load, a.ckpt_step)?;
            let path = dist_to_native(&ck, &a.save, None, true)?;
            println!("converted Megatron-Core torch_dist iteration {} to {}", ck.iteration(), path.display());
            Ok(())
        }
        (Format::TorchDist, Target::Hf) => {
            let ck = megatron_checkpoint_megatron::dist::open(&a.load, a.ckpt_step)?;
            let tmp = TempCheckpoint(a.save.with_extension(format!("native-tmp-{}", std::process::id())));
            dist_to_native(&ck, &tmp.0, None, true)?;
            export_hf(&tmp.0, None, &a.save, registry)
        }
        (Format::TorchDist, Target::MegatronLegacy) => {
            let ck = megatron_checkpoint_megatron::dist::open(&a.load, a.ckpt_step)?;
            let tensors = ck.full_tensors(&mut progress("reading", false))?;
            let args = native_args(&ck.args, ck.shape.padded_vocab);
            let sched = ck.scheduler_state().map(|v| v.to_json()).unwrap_or_default();
            write_megatron(a, ck.iteration(), &tensors, &args, &sched, None)
        }
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
            let optim = read_optimizer(&ck)?;
            write_megatron(a, ck.iteration(), &tensors, &args, &sched, optim.as_ref())
        }
        (Format::Native, Target::MegatronLegacy) => {
            let ck = megatron_checkpoint::load(&a.load, a.ckpt_step)?;
            let mut tensors = BTreeMap::new();
            let mut optim = BTreeMap::new();
            for name in ck.tensor_names() {
                let (data, shape) = ck.tensor(name)?;
                match name.strip_prefix(megatron_checkpoint::metadata::OPTIMIZER_PREFIX) {
                    Some(key) => {
                        let (param, state) = key
                            .rsplit_once('.')
                            .with_context(|| format!("optimizer tensor `{name}` is not `optimizer.<param>.<state>`"))?;
                        optim.insert((param.to_string(), state.to_string()), tensor_data(data, shape));
                    }
                    None => {
                        tensors.insert(name.to_string(), tensor_data(data, shape));
                    }
                }
            }
            let scalars = &ck.metadata.optimizer;
            let optim = (ck.metadata.optimizer_saved && !optim.is_empty()).then(|| FullOptimizerState {
                step: scalars["step"].as_u64().unwrap_or(0),
                tensors: optim,
                grad_scaler: scalars.get("grad_scaler").cloned(),
                param_groups: Vec::new(),
            });
            let mut args = ck.metadata.meta.args.clone();
            if let (Some(m), Some(w)) = (args.as_object_mut(), tensors.get("embedding.word_embeddings.weight")) {
                m.insert("padded_vocab_size".into(), json!(w.shape[0]));
            }
            // Megatron keeps the data position in `args` (our metadata keeps it beside them).
            if let Some(m) = args.as_object_mut() {
                let meta = &ck.metadata.meta;
                m.insert("consumed_train_samples".into(), json!(meta.consumed_train_samples));
                m.insert("skipped_train_samples".into(), json!(meta.skipped_train_samples));
                m.insert("consumed_valid_samples".into(), json!(meta.consumed_valid_samples));
            }
            write_megatron(a, ck.iteration(), &tensors, &args, &ck.metadata.meta.lr_scheduler, optim.as_ref())
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
    optim: Option<&FullOptimizerState>,
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
    // A half-precision model is written with Megatron's fp16 wrapper (fp32 main params).
    let half = tensors.values().any(|t| matches!(t.dtype, TorchDType::BF16 | TorchDType::F16));
    let optim = optim.filter(|_| !a.no_save_optim).map(|state| OptimizerOut {
        state,
        half,
        hyper: GroupHyper::from_args(args),
    });
    if let Some(o) = &optim {
        if half && !o.state.tensors.keys().any(|(_, s)| s == "main_param") {
            bail!("the half-precision model's optimizer state has no fp32 main params; convert with --no-save-optim");
        }
    }
    let dir = write_legacy(
        &a.save,
        iteration,
        tensors,
        &target,
        &check,
        sched,
        optim.as_ref(),
        &mut progress("writing", false),
    )?;
    println!("wrote Megatron-LM legacy tp{tp} x pp{pp} iteration {iteration} to {}", dir.display());
    Ok(())
}

fn export_hf(native: &Path, step: Option<u64>, out: &Path, registry: &Registry) -> Result<()> {
    let load = crate::generate::LoadArgs { load: native.to_path_buf(), ckpt_step: step, ..Default::default() };
    let load = crate::generate::LoadArgs { backend: "cpu".into(), ..load };
    crate::hf::export::run(&crate::hf::export::ExportHfArgs { load, out: out.to_path_buf(), dtype: None }, registry)
}
