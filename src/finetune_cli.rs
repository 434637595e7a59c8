//! `megatron finetune`: BERT finetuning on a GLUE classification task, like Megatron's
//! `tasks/main.py --task MNLI|QQP` (SPEC §9.4), plus MRPC and RTE in the GLUE TSV layout,
//! or on RACE (`--task RACE`, SPEC §9.3: multiple choice, a `--micro-batch-size` of questions
//! is 4× as many rows): the pretrained `bert` checkpoint (`--load`, e.g. from `megatron
//! import hf`) with the pooler + `classification_head` (or `multichoice_head`) of
//! `megatron_bert::BertClassifier`, Adam with a linear
//! warmup/decay schedule, clipping, epochs over the shuffled training rows (the last partial
//! batch dropped, as Megatron's loader), validation accuracy per epoch on every
//! `--valid-data` file (with the majority-class rate for reference), a checkpoint per epoch
//! in `--save`. Runs at tp = 1 on one rank.

use crate::finetune_data::{Example, FinetuneTask, Row};
use crate::finetune_dump::StepDump;
use crate::hf::bert::load_bert_checkpoint;
use anyhow::{bail, Context, Result};
use clap::Args;
use megatron_bert::{BertBatch, BertClassifier};
use megatron_core::{Backend, Mode, Optimizer, ParallelContext, Registry};
use std::path::PathBuf;

#[derive(Args, Clone, Debug)]
pub struct FinetuneArgs {
    /// MNLI, QQP, MRPC, RTE (TSV files) or RACE (directories of `*.txt` JSON documents).
    #[arg(long)]
    pub task: String,
    #[arg(long, num_args = 1.., required = true)]
    pub train_data: Vec<PathBuf>,
    #[arg(long, num_args = 1.., required = true)]
    pub valid_data: Vec<PathBuf>,
    /// The pretrained `bert` checkpoint.
    #[command(flatten)]
    pub load: crate::generate::LoadArgs,
    /// Where the finetuned checkpoints go (one per epoch).
    #[arg(long)]
    pub save: Option<PathBuf>,
    #[arg(long, default_value_t = 3)]
    pub epochs: usize,
    #[arg(long, default_value_t = 8)]
    pub micro_batch_size: usize,
    #[arg(long, default_value_t = 128)]
    pub seq_length: usize,
    #[arg(long, default_value_t = 5e-5)]
    pub lr: f64,
    #[arg(long, default_value_t = 0.065)]
    pub lr_warmup_fraction: f64,
    #[arg(long, default_value_t = 0.01)]
    pub weight_decay: f64,
    #[arg(long, default_value_t = 1.0)]
    pub clip_grad: f64,
    #[arg(long, default_value_t = 0.1)]
    pub hidden_dropout: f32,
    #[arg(long, default_value_t = 0.1)]
    pub attention_dropout: f32,
    #[arg(long, default_value_t = 1234)]
    pub seed: u64,
    #[arg(long, default_value_t = 10)]
    pub log_interval: usize,
    /// Also report the accuracy on the training rows after every epoch (eval mode): tells an
    /// optimisation problem (train accuracy stuck) from overfitting.
    #[arg(long)]
    pub eval_train: bool,
    /// Writes the first training step(s) (batch, logits, loss, every parameter before the step,
    /// every gradient before clipping, the learning rate, every parameter after the step) to
    /// this safetensors file and stops; `scripts/bert_finetune_step_check.py` compares it with
    /// transformers (use `--hidden-dropout 0 --attention-dropout 0` for a comparable step).
    #[arg(long)]
    pub dump_first_step: Option<PathBuf>,
    /// How many steps `--dump-first-step` covers (batches, logits, losses and learning rates of
    /// each; the gradients of the first; the parameters after the last).
    #[arg(long, default_value_t = 1)]
    pub dump_steps: usize,
}

fn batch(rows: &[&Row], seq: usize, seed: u64) -> BertBatch {
    let n = rows.len();
    BertBatch {
        batch: n,
        seq,
        tokens: rows.iter().flat_map(|r| r.0.iter().copied()).collect(),
        types: rows.iter().flat_map(|r| r.1.iter().copied()).collect(),
        lengths: rows.iter().map(|r| r.2).collect(),
        labels: vec![0; n * seq],
        loss_mask: vec![0.0; n * seq],
        is_random: rows.iter().map(|r| r.3).collect(),
        seed,
    }
}

/// splitmix64: the shuffle and dropout seeds (a pure function of the seed and the counter).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Correct predictions of the classifier on `examples` (eval mode).
fn accuracy(model: &mut BertClassifier, examples: &[Example], seq: usize, mbs: usize) -> Result<usize> {
    let mut correct = 0;
    for chunk in examples.chunks(mbs) {
        let refs: Vec<&Row> = chunk.iter().flatten().collect();
        let out = model.forward(&batch(&refs, seq, 0), Mode::Eval)?;
        correct += out.predictions.iter().zip(chunk).filter(|(p, e)| **p as i32 == e[0].3).count();
    }
    Ok(correct)
}

/// What a finetuning run gave (for tests): per epoch the mean training loss and the
/// accuracy (%) on each `--valid-data` path.
#[derive(Clone, Debug, Default)]
pub struct FinetuneSummary {
    pub epoch_losses: Vec<f64>,
    pub accuracies: Vec<Vec<f64>>,
}

pub fn run(args: &FinetuneArgs, registry: &Registry) -> Result<()> {
    finetune(args, registry).map(|_| ())
}

/// [`run`], returning the per-epoch numbers.
pub fn finetune(args: &FinetuneArgs, registry: &Registry) -> Result<FinetuneSummary> {
    let task = FinetuneTask::parse(&args.task)?;
    if args.micro_batch_size == 0 || args.epochs == 0 || args.seq_length < 3 {
        bail!("--micro-batch-size and --epochs must be >= 1 and --seq-length >= 3");
    }
    if args.dump_steps == 0 {
        bail!("--dump-steps must be >= 1");
    }
    let loaded = load_bert_checkpoint(registry, &args.load, [args.hidden_dropout, args.attention_dropout])?;
    let seq = args.seq_length;
    if seq > loaded.model.config().max_position_embeddings {
        bail!("--seq-length {seq} exceeds the model's {} positions", loaded.model.config().max_position_embeddings);
    }
    let read = |paths: &[PathBuf]| -> Result<Vec<(PathBuf, Vec<Example>)>> {
        paths.iter().map(|p| Ok((p.clone(), task.read(p, loaded.tokenizer.as_ref(), seq)?))).collect()
    };
    let train: Vec<Example> = read(&args.train_data)?.into_iter().flat_map(|(_, r)| r).collect();
    let valid = read(&args.valid_data)?;
    let mut model = match task {
        FinetuneTask::Race => BertClassifier::multiple_choice(loaded.model, task.choices(), args.seed)?,
        FinetuneTask::Glue(_) => BertClassifier::new(loaded.model, task.num_classes(), args.seed)?,
    };
    let backend = model.bert.backend();
    let mut adam = megatron_optim::Adam::new(megatron_optim::AdamConfig::default())?;
    let mbs = args.micro_batch_size;
    let per_epoch = train.len() / mbs;
    if per_epoch == 0 {
        bail!("{} training examples are fewer than --micro-batch-size {mbs}", train.len());
    }
    let total = per_epoch * args.epochs;
    let warmup = (args.lr_warmup_fraction * total as f64).round() as usize;
    let lr_at = |it: usize| {
        if it < warmup {
            args.lr * (it + 1) as f64 / warmup as f64
        } else {
            args.lr * (total - it) as f64 / (total - warmup).max(1) as f64
        }
    };
    println!(
        "finetuning {} ({} {}) from {} (iteration {}): {} training examples, {per_epoch} iterations per epoch, \
         {} epochs",
        task.name(),
        task.num_classes(),
        if task.choices() > 1 { "options per question" } else { "classes" },
        args.load.load.display(),
        loaded.iteration,
        train.len(),
        args.epochs
    );
    let ctx = ParallelContext::single();
    let mut it = 0usize;
    let mut dump = args.dump_first_step.as_ref().map(|_| StepDump::default());
    let mut summary = FinetuneSummary::default();
    for epoch in 0..args.epochs {
        // Fisher-Yates with a per-epoch stream: the order depends on --seed and the epoch only.
        let mut order: Vec<usize> = (0..train.len()).collect();
        for i in (1..order.len()).rev() {
            let j = (mix(args.seed ^ mix(epoch as u64 * 1_000_003 + i as u64)) % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
        let (mut loss_sum, mut rows_seen) = (0.0, 0usize);
        let mut epoch_loss = 0.0;
        for step in 0..per_epoch {
            let rows: Vec<&Row> = order[step * mbs..(step + 1) * mbs].iter().flat_map(|&i| &train[i]).collect();
            zero_grads(&mut model, backend.as_ref())?;
            let x = batch(&rows, seq, mix(args.seed + it as u64));
            // The first --dump-steps steps go to the --dump-first-step file.
            let dumping = dump.is_some() && it < args.dump_steps;
            let tag = format!("s{it:03}");
            if let Some(d) = dump.as_mut().filter(|_| dumping) {
                // Rows (mbs · choices of them) and one label per example.
                let (n, c) = (x.batch, task.choices());
                d.add_ints(&format!("{tag}.tokens"), &[n, seq], x.tokens.iter().map(|&v| v as i64));
                d.add_ints(&format!("{tag}.types"), &[n, seq], x.types.iter().map(|&v| v as i64));
                d.add_ints(&format!("{tag}.lengths"), &[n], x.lengths.iter().map(|&v| v as i64));
                d.add_ints(&format!("{tag}.labels"), &[mbs], x.is_random.iter().step_by(c).map(|&v| v as i64));
                if it == 0 {
                    d.add_params("before", &model.params(), false, backend.as_ref())?;
                }
            }
            let out = model.forward(&x, Mode::Train)?;
            model.backward(1.0 / mbs as f32)?;
            let lr = lr_at(it);
            let grad_norm = {
                if let Some(d) = dump.as_mut().filter(|_| it == 0) {
                    d.add_params("grad", &model.params(), true, backend.as_ref())?;
                }
                let mut params = model.params_mut();
                let norm = megatron_optim::clip_grad_norm(&mut params, args.clip_grad, backend.as_ref(), &ctx)?;
                adam.step(&mut params, lr, args.weight_decay, backend.as_ref())?;
                norm
            };
            if let Some(d) = dump.as_mut().filter(|_| dumping) {
                d.add(&format!("{tag}.logits"), &[mbs, model.ways()], out.logits.clone());
                d.add(&format!("{tag}.loss"), &[1], vec![(out.loss_sum / mbs as f64) as f32]);
                d.add(&format!("{tag}.grad_norm"), &[1], vec![grad_norm as f32]);
                d.add(&format!("{tag}.lr"), &[1], vec![lr as f32]);
            }
            if dumping && it + 1 == args.dump_steps.min(total) {
                if let (Some(mut d), Some(path)) = (dump.take(), &args.dump_first_step) {
                    d.add("weight_decay", &[1], vec![args.weight_decay as f32]);
                    d.add("clip_grad", &[1], vec![args.clip_grad as f32]);
                    d.add("choices", &[1], vec![task.choices() as f32]);
                    d.add_params("after", &model.params(), false, backend.as_ref())?;
                    d.write(path)?;
                    return Ok(summary);
                }
            }
            it += 1;
            loss_sum += out.loss_sum;
            epoch_loss += out.loss_sum;
            rows_seen += mbs;
            if it.is_multiple_of(args.log_interval) {
                println!(
                    " iteration {it:6}/{total:6} | epoch {} | learning rate: {lr:.3E} | loss: {:.4}",
                    epoch + 1,
                    loss_sum / rows_seen as f64
                );
                (loss_sum, rows_seen) = (0.0, 0);
            }
        }
        if args.eval_train {
            let correct = accuracy(&mut model, &train, seq, mbs)?;
            println!(
                "epoch {} | training rows: accuracy {:.2}% ({correct}/{})",
                epoch + 1,
                100.0 * correct as f64 / train.len() as f64,
                train.len()
            );
        }
        summary.epoch_losses.push(epoch_loss / (per_epoch * mbs) as f64);
        let mut accuracies = Vec::new();
        for (path, rows) in &valid {
            let correct = accuracy(&mut model, rows, seq, mbs)?;
            accuracies.push(100.0 * correct as f64 / rows.len() as f64);
            let mut counts = vec![0usize; task.num_classes()];
            rows.iter().for_each(|e| counts[e[0].3 as usize] += 1);
            let majority = counts.iter().max().copied().unwrap_or(0);
            println!(
                "epoch {} | {}: accuracy {:.2}% ({correct}/{}) | majority class {:.2}%",
                epoch + 1,
                path.display(),
                100.0 * correct as f64 / rows.len() as f64,
                rows.len(),
                100.0 * majority as f64 / rows.len() as f64
            );
        }
        summary.accuracies.push(accuracies);
        if let Some(dir) = &args.save {
            let mut meta_args = loaded.args.clone();
            meta_args["finetune_task"] = serde_json::json!(task.name());
            meta_args["finetune_classes"] = serde_json::json!(task.num_classes());
            let meta = megatron_checkpoint::CheckpointMeta { args: meta_args, ..Default::default() };
            let path = megatron_checkpoint::save(dir, it as u64, &model.params(), None, meta, backend.as_ref(), &ctx)
                .with_context(|| format!("saving the finetuned model to {}", dir.display()))?;
            println!("saved {}", path.display());
        }
    }
    Ok(summary)
}

fn zero_grads(model: &mut BertClassifier, backend: &dyn Backend) -> Result<()> {
    for p in model.params_mut() {
        backend.fill(&mut p.grad, 0.0)?;
    }
    Ok(())
}
