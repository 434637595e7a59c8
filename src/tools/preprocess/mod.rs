//! `megatron preprocess`: Megatron's `tools/preprocess_data.py` (SPEC §1.10) and, with
//! `--merge`, `tools/merge_datasets.py`.
//!
//! Input records ([`input`]: JSONL, gzip, plain text by lines or paragraphs) are encoded by any
//! registered tokenizer ([`encode`], optionally after [`sentences`] splitting) in a streaming
//! pipeline of bounded memory ([`pipeline`]) and written to
//! `{output_prefix}_{key}_{document|sentence}.{bin,idx}`, byte-identical to Megatron for the
//! same tokens. Outputs appear under their final names only once everything succeeded (the
//! builder writes `.tmp` files, and all keys are finalized after the last record).
//!
//! Differences from Megatron, on purpose: one pass does both sentence splitting and encoding
//! (Megatron's single-partition `--split-sentences` run only writes the split file); every
//! key's output is finalized (Megatron finalizes only the last key's); `--workers` are threads
//! and `--partitions` is not needed (nor accepted); bad lines can be skipped.

pub mod encode;
pub mod input;
pub mod merge;
pub mod pipeline;
pub mod progress;
pub mod sentences;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use encode::Encoder;
use input::{InputFormat, RecordReader};
use megatron_core::Registry;
use megatron_datasets::indexed::with_suffix;
use megatron_datasets::{IndexedDatasetBuilder, TokenDType};
use pipeline::OnBadLine;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// `megatron preprocess` flags (Megatron's names).
#[derive(Args, Clone, Debug)]
pub struct PreprocessArgs {
    /// Input file (`.jsonl`, `.json`, `.txt`, optionally `.gz`); with --merge, dataset prefixes
    /// or directories of datasets.
    #[arg(long, num_args = 1.., required = true)]
    pub input: Vec<PathBuf>,
    /// How to read --input: `auto` (by extension: .jsonl/.json/.ndjson → jsonl, .txt →
    /// text-lines), `jsonl`, `text-lines` (a document per non-blank line) or `text-paragraphs`
    /// (documents separated by blank lines).
    #[arg(long, value_enum, default_value = "auto")]
    pub input_format: InputFormat,
    /// JSON keys to extract; one output dataset per key. With text input, the single key only
    /// names the output.
    #[arg(long, num_args = 1.., default_values_t = ["text".to_string()])]
    pub json_keys: Vec<String>,
    /// Output prefix: writes `{prefix}_{key}_{document|sentence}.{bin,idx}` (with --merge,
    /// `{prefix}.{bin,idx}`).
    #[arg(long)]
    pub output_prefix: PathBuf,
    /// The tokenizer flags (src/tokenizer_flags.rs).
    #[command(flatten)]
    pub tokenizer: crate::tokenizer_flags::TokenizerArgs,
    /// Append the tokenizer's EOD id to every non-empty document.
    #[arg(long)]
    pub append_eod: bool,
    /// Split documents into sentences (one sequence per sentence, output `..._sentence`): rule
    /// based (`.?!` + closing quotes + space + capital or digit; abbreviations and initials kept),
    /// not NLTK punkt, so sentence outputs differ from Megatron's.
    #[arg(long)]
    pub split_sentences: bool,
    /// With --split-sentences, keep the whitespace (newlines) that follows each sentence.
    #[arg(long)]
    pub keep_newlines: bool,
    /// Encoding threads.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Print progress every N documents.
    #[arg(long, default_value_t = 1000)]
    pub log_interval: u64,
    /// What to do with a malformed line (bad JSON, missing key, non-string value, bad UTF-8).
    #[arg(long, value_enum, default_value = "fail")]
    pub on_bad_line: OnBadLine,
    /// Accepted for compatibility; only `mmap` exists.
    #[arg(long, default_value = "mmap")]
    pub dataset_impl: String,
    /// Merge the datasets given as --input into --output-prefix (tools/merge_datasets.py).
    #[arg(long)]
    pub merge: bool,
}

/// What `megatron preprocess` wrote.
#[derive(Debug)]
pub struct PreprocessSummary {
    /// Output prefixes (one per key; the merge output with --merge).
    pub outputs: Vec<PathBuf>,
    pub documents: u64,
    pub input_bytes: u64,
    pub seconds: f64,
    pub skipped_lines: u64,
    pub first_skipped: Vec<(u64, String)>,
    pub blank_lines: u64,
}

/// The output prefix of `key`: `{output_prefix}_{key}_{level}`.
pub fn output_prefix_for(output_prefix: &Path, key: &str, split_sentences: bool) -> PathBuf {
    let level = if split_sentences { "sentence" } else { "document" };
    with_suffix(output_prefix, &format!("_{key}_{level}"))
}

/// The tokenizer plugin config: only the flags that were given, so that each tokenizer's
/// `deny_unknown_fields` config accepts it.
pub fn tokenizer_config(a: &PreprocessArgs) -> Value {
    a.tokenizer.flags().config()
}

fn validate(a: &PreprocessArgs) -> Result<()> {
    let mut errors = Vec::new();
    let mut need = |ok: bool, msg: &str| {
        if !ok {
            errors.push(msg.to_string());
        }
    };
    need(a.dataset_impl == "mmap", "--dataset-impl: only `mmap` is supported (Megatron's only current format)");
    if !a.merge {
        need(a.input.len() == 1, "give exactly one --input file (several are only for --merge)");
        need(
            a.tokenizer.tokenizer_type.is_some(),
            "--tokenizer-type is required (see `megatron list --kind tokenizer`)",
        );
        need(a.workers > 0, "--workers must be > 0");
        need(a.log_interval > 0, "--log-interval must be > 0");
        need(!a.json_keys.is_empty(), "--json-keys needs at least one key");
        need(!a.keep_newlines || a.split_sentences, "--keep-newlines only applies with --split-sentences");
        let mut keys = a.json_keys.clone();
        keys.sort();
        keys.dedup();
        need(keys.len() == a.json_keys.len(), "--json-keys lists a key twice");
    }
    let dir = a.output_prefix.parent().filter(|d| !d.as_os_str().is_empty());
    need(
        dir.is_none_or(|d| d.is_dir()),
        &format!("the directory of --output-prefix `{}` does not exist; create it first", a.output_prefix.display()),
    );
    if !errors.is_empty() {
        bail!("invalid preprocess arguments:\n  - {}", errors.join("\n  - "));
    }
    Ok(())
}

/// Runs `megatron preprocess` (or the merge) and prints a summary to stderr.
pub fn run(a: &PreprocessArgs, registry: &Registry) -> Result<PreprocessSummary> {
    validate(a)?;
    if a.merge {
        let start = std::time::Instant::now();
        let m = merge::merge(&a.input, &a.output_prefix)?;
        eprintln!(
            "merged {} datasets into `{}`: {} documents, {} sequences",
            m.inputs.len(),
            a.output_prefix.display(),
            m.documents,
            m.sequences
        );
        return Ok(PreprocessSummary {
            outputs: vec![a.output_prefix.clone()],
            documents: m.documents as u64,
            input_bytes: 0,
            seconds: start.elapsed().as_secs_f64(),
            skipped_lines: 0,
            first_skipped: vec![],
            blank_lines: 0,
        });
    }
    let tokenizer_type =
        a.tokenizer.tokenizer_type.as_deref().ok_or_else(|| anyhow!("--tokenizer-type is required"))?;
    let tokenizer = registry
        .tokenizer(tokenizer_type, tokenizer_config(a))
        .with_context(|| format!("building the tokenizer {tokenizer_type} from --vocab-file/--merge-file/..."))?;
    if tokenizer_type.starts_with("BertWordPiece") && !a.split_sentences {
        eprintln!("warning: a BERT tokenizer is used without --split-sentences; BERT/T5 datasets expect sentences");
    }
    let append_eod = match (a.append_eod, tokenizer.special_ids().eod) {
        (false, _) => None,
        (true, Some(eod)) => Some(eod),
        (true, None) => bail!("--append-eod: the tokenizer {tokenizer_type} has no EOD token"),
    };
    let wrap = if tokenizer_type.starts_with("BertWordPiece") && !a.tokenizer.tokenizer_hf_no_include_special_tokens {
        let ids = tokenizer.special_ids();
        match (ids.cls, ids.sep) {
            (Some(cls), Some(sep)) => Some((cls, sep)),
            _ => bail!(
                "the tokenizer {tokenizer_type} has no [CLS]/[SEP] ids to wrap documents in; \
                 add them to the vocabulary or pass --tokenizer-hf-no-include-special-tokens"
            ),
        }
    } else {
        None
    };
    let input_path = &a.input[0];
    let reader = RecordReader::open(input_path, a.input_format)?;
    let format = reader.format();
    if format != InputFormat::Jsonl && a.json_keys.len() != 1 {
        bail!("text input makes one dataset: give a single --json-keys name for it (default `text`)");
    }
    // SPEC §1.3: uint16 below 65500 ids, else int32.
    let dtype = TokenDType::optimal_for_vocab(tokenizer.vocab_size());
    let outputs: Vec<PathBuf> =
        a.json_keys.iter().map(|k| output_prefix_for(&a.output_prefix, k, a.split_sentences)).collect();
    let mut builders = outputs.iter().map(|p| IndexedDatasetBuilder::create(p, dtype)).collect::<Result<Vec<_>>>()?;
    // One tokenizer per worker: a tokenizer may keep a cache behind a lock (the GPT-2 one
    // does), which workers sharing it would contend for.
    let mut tokenizers = vec![tokenizer];
    for _ in 1..a.workers {
        tokenizers.push(registry.tokenizer(tokenizer_type, tokenizer_config(a))?);
    }
    let encoders: Vec<Encoder> = tokenizers
        .into_iter()
        .map(|tokenizer| Encoder {
            tokenizer,
            keys: a.json_keys.clone(),
            format,
            split_sentences: a.split_sentences,
            keep_newlines: a.keep_newlines,
            append_eod,
            wrap,
        })
        .collect();
    // On any error the builders are dropped unfinalized: their `.tmp` files are removed and no
    // final-named output appears.
    let outcome = pipeline::run(reader, input_path, &encoders, a.on_bad_line, a.log_interval, &mut builders)?;
    for b in builders {
        b.finalize()?;
    }
    let summary = PreprocessSummary {
        outputs,
        documents: outcome.documents,
        input_bytes: outcome.input_bytes,
        seconds: outcome.seconds,
        skipped_lines: outcome.skipped_lines,
        first_skipped: outcome.first_skipped,
        blank_lines: outcome.blank_lines,
    };
    report(&summary, input_path);
    Ok(summary)
}

fn report(s: &PreprocessSummary, input: &Path) {
    let secs = s.seconds.max(1e-9);
    eprintln!(
        "Done: {} documents from `{}` in {:.2} s ({:.1} docs/s, {:.2} MB/s); wrote {}",
        s.documents,
        input.display(),
        s.seconds,
        s.documents as f64 / secs,
        s.input_bytes as f64 / secs / (1024.0 * 1024.0),
        s.outputs.iter().map(|p| format!("`{}`", p.display())).collect::<Vec<_>>().join(", ")
    );
    if s.blank_lines > 0 {
        eprintln!("skipped {} blank lines", s.blank_lines);
    }
    if s.skipped_lines > 0 {
        let first: Vec<String> = s.first_skipped.iter().map(|(l, why)| format!("line {l}: {why}")).collect();
        eprintln!("skipped {} bad lines (--on-bad-line skip); first: {}", s.skipped_lines, first.join("; "));
    }
}
