//! `megatron generate`: loads a checkpoint and generates from `--prompt` (streaming tokens to
//! stdout as they are produced) or from every line of `--prompts-file` (one static batch,
//! printed when done).

use super::engine::{GenerationParams, Generator};
use super::loader::{load_model, LoadArgs, LoadedModel};
use super::sampling::SamplingParams;
use anyhow::{bail, Context, Result};
use clap::Args;
use megatron_core::Registry;
use std::io::Write;
use std::path::PathBuf;

#[derive(Args, Clone, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// Prompt text.
    #[arg(long)]
    pub prompt: Option<String>,
    /// A file with one prompt per line, generated as one batch.
    #[arg(long)]
    pub prompts_file: Option<PathBuf>,
    #[arg(long, alias = "num-tokens-to-generate", default_value_t = 30)]
    pub tokens_to_generate: usize,
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    /// 1 = greedy; 0 = off.
    #[arg(long, alias = "top_k", default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, alias = "top_p", default_value_t = 0.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 1234)]
    pub seed: u64,
    /// Extra token ids that end generation (besides the tokenizer's end-of-document).
    #[arg(long, num_args = 1..)]
    pub stop_token: Vec<i32>,
    /// Prepend the end-of-document token to every prompt (Megatron's add_BOS).
    #[arg(long)]
    pub add_bos: bool,
    /// Recompute the whole prefix every step instead of using the kv cache.
    #[arg(long)]
    pub no_kv_cache: bool,
    /// Prompt a chat model: render the prompt as a user turn with the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// System message of `--chat` (default: whatever the template adds).
    #[arg(long)]
    pub system: Option<String>,
    /// A Jinja chat template file (default: the tokenizer's `chat_template`).
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
    /// Ranks as threads of this process (= tensor x pipeline parallel size): rank 0 generates,
    /// the others make its model calls on their shards. Same tokens as one rank.
    #[arg(long, default_value_t = 1)]
    pub nproc: usize,
    #[arg(long, default_value_t = 1)]
    pub tensor_model_parallel_size: usize,
    #[arg(long, default_value_t = 1)]
    pub pipeline_model_parallel_size: usize,
    /// `auto` (MPI processes when `mpirun`/`srun` started this one, else threads), `mpi` or
    /// `local`; under MPI rank 0 generates and prints, the others follow (N = T x P processes).
    #[arg(long, default_value = "auto", value_parser = ["auto", "mpi", "local"])]
    pub distributed_backend: String,
}

/// Checks the sampling flags with the server's rules (SPEC §8.1).
pub fn sampling_from(temperature: f32, top_k: usize, top_p: f32) -> Result<SamplingParams> {
    if !(temperature > 0.0 && temperature <= 100.0) {
        bail!("--temperature must be in (0, 100], got {temperature}");
    }
    if temperature < f32::MIN_POSITIVE {
        bail!(
            "--temperature {temperature:e} is too small (below {:e}); for greedy decoding use --top-k 1",
            f32::MIN_POSITIVE
        );
    }
    if top_k > 1000 {
        bail!("--top-k must be in [0, 1000], got {top_k}");
    }
    if !(0.0..=1.0).contains(&top_p) {
        bail!("--top-p must be in [0, 1], got {top_p}");
    }
    if top_k > 0 && top_p > 0.0 {
        bail!("--top-k and --top-p cannot be combined; give one of them");
    }
    Ok(SamplingParams { temperature, top_k, top_p, ..SamplingParams::default() })
}

pub fn run(args: &GenerateArgs, registry: &Registry) -> Result<()> {
    let mpi =
        crate::distributed::select_from_env(&args.distributed_backend, args.nproc)? == crate::distributed::Backend::Mpi;
    let parallel = mpi || args.nproc * args.tensor_model_parallel_size * args.pipeline_model_parallel_size > 1;
    #[cfg(feature = "t5")]
    if super::t5::is_t5_checkpoint(&args.load) {
        if parallel {
            bail!(
                "--nproc/--tensor-model-parallel-size/--pipeline-model-parallel-size: T5 generation runs on one rank"
            );
        }
        return super::t5::run(args, registry);
    }
    #[cfg(feature = "hybrid")]
    if super::hybrid::is_hybrid_checkpoint(&args.load) {
        if parallel {
            bail!(
                "--nproc/--tensor-model-parallel-size/--pipeline-model-parallel-size: hybrid generation runs on one rank"
            );
        }
        return super::hybrid::run(args, registry);
    }
    let prompts: Vec<String> = match (&args.prompt, &args.prompts_file) {
        (Some(p), None) => vec![p.clone()],
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("reading --prompts-file {}", f.display()))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(String::from)
            .collect(),
        _ => bail!("give exactly one of --prompt TEXT or --prompts-file FILE"),
    };
    if prompts.is_empty() {
        bail!("--prompts-file has no non-empty line");
    }
    let sampling = sampling_from(args.temperature, args.top_k, args.top_p)?;
    if !parallel {
        let mut loaded = load_model(registry, &args.load)?;
        return generate(args, prompts, sampling, &mut loaded);
    }
    let (tp, pp) = (args.tensor_model_parallel_size, args.pipeline_model_parallel_size);
    if mpi {
        // One rank per process: rank 0 generates and prints, the others make its model calls.
        let comm = crate::serve::ranks::mpi_world(registry)?; // held here: MPI_Finalize on this thread
        return crate::serve::ranks::run_mpi_rank(comm.as_ref(), || {
            let mut loaded = crate::serve::ranks::load_mpi_rank(registry, &args.load, comm.clone(), tp, pp)?;
            if comm.rank() != 0 {
                return megatron_serving::ranks::follow(&mut loaded.model);
            }
            super::ranks::with_followers(&mut loaded, Vec::new(), |l| generate(args, prompts, sampling, l))
        });
    }
    let (mut loaded, followers) = crate::serve::ranks::load_ranks(registry, &args.load, args.nproc, tp, pp)?;
    super::ranks::with_followers(&mut loaded, followers, |l| generate(args, prompts, sampling, l))
}

/// Generates from `prompts` with `loaded` and prints the result.
fn generate(
    args: &GenerateArgs,
    prompts: Vec<String>,
    sampling: SamplingParams,
    loaded: &mut LoadedModel,
) -> Result<()> {
    let tok = loaded.tokenizer.clone();
    let prompts = if args.chat {
        let template = super::chat::find_template(args.chat_template.as_deref(), &loaded.args)?;
        let special = tok.special_ids();
        let name = |id: Option<u32>| id.and_then(|i| tok.decode(&[i]).ok()).unwrap_or_default();
        let (bos, eos) = (name(special.bos), name(special.eos));
        prompts
            .iter()
            .map(|p| super::chat::render(&template, args.system.as_deref(), p, &bos, &eos))
            .collect::<Result<Vec<_>>>()?
    } else {
        prompts
    };
    let mut ids = Vec::new();
    for p in &prompts {
        let mut row: Vec<i32> = Vec::new();
        if args.add_bos {
            row.push(loaded.eod);
        }
        row.extend(tok.encode(p)?.into_iter().map(|t| t as i32));
        if row.is_empty() {
            bail!("prompt {p:?} tokenizes to nothing; give text or --add-bos");
        }
        ids.push(row);
    }
    let mut stop_tokens = vec![loaded.eod];
    stop_tokens.extend(&args.stop_token);
    let params = GenerationParams {
        tokens_to_generate: args.tokens_to_generate,
        sampling,
        stop_tokens,
        seed: args.seed,
        use_kv_cache: !args.no_kv_cache,
        ..GenerationParams::default()
    };
    let streaming = ids.len() == 1;
    let mut out = std::io::stdout().lock();
    // Streaming prints the growing suffix of the decoded text, so tokenizers whose pieces
    // need context (separators, multi-byte characters split over tokens) print correctly.
    let mut so_far: Vec<u32> = ids[0].iter().map(|&t| t as u32).collect();
    let mut printed = tok.decode(&so_far)?;
    if streaming {
        write!(out, "{printed}")?;
        out.flush()?;
    }
    let mut gen = Generator { model: &mut loaded.model, vocab_size: loaded.vocab_size, pad_id: loaded.eod };
    let t0 = std::time::Instant::now();
    let mut count = 0usize;
    let result = gen.generate(&ids, &params, &mut |_, token| {
        count += 1;
        if streaming {
            so_far.push(token as u32);
            let text = tok.decode(&so_far).unwrap_or_default();
            // An incomplete multi-byte character decodes to U+FFFD: wait for its last byte.
            if text.ends_with('\u{FFFD}') {
                return true;
            }
            if let Some(new) = text.strip_prefix(printed.as_str()) {
                let _ = write!(out, "{new}");
                let _ = out.flush();
                printed = text;
            }
        }
        true
    })?;
    let secs = t0.elapsed().as_secs_f64();
    if streaming {
        writeln!(out)?;
    } else {
        for (r, row) in result.tokens.iter().enumerate() {
            let ids: Vec<u32> = row.iter().map(|&t| t as u32).collect();
            writeln!(out, "[{r}] {}", tok.decode(&ids)?)?;
        }
    }
    eprintln!(
        "generated {count} tokens in {secs:.2}s ({:.1} ms/token, kv cache {})",
        1e3 * secs / count.max(1) as f64,
        if args.no_kv_cache { "off" } else { "on" }
    );
    Ok(())
}
