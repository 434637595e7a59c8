//! `megatron tokenizer train`: trains a byte-level BPE vocabulary (GPT-2 pre-tokenizer and
//! byte alphabet) and writes GPT-2-format `vocab.json` + `merges.txt`. The work is done by
//! `megatron_tokenizers::bpe_train`; this file only parses flags and reports.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use megatron_tokenizers::bpe_train::{count_files, train_byte_level_bpe, BpeTrainOptions, MAX_VOCAB_SIZE};
use std::path::PathBuf;
use std::time::Instant;

/// `megatron tokenizer ...` subcommands.
#[derive(Subcommand, Debug)]
pub enum TokenizerCommand {
    /// Train a byte-level BPE tokenizer (loadable as GPT2BPETokenizer and by Hugging Face).
    Train(TrainArgs),
}

/// `megatron tokenizer train` flags.
#[derive(Args, Debug, Clone)]
pub struct TrainArgs {
    /// Training text: plain text files, or JSON lines (files ending in .jsonl, or any file when
    /// --json-key is given). Repeatable.
    #[arg(long, required = true, num_args = 1..)]
    pub input: Vec<PathBuf>,
    /// Read the inputs as JSON lines and train on this string field of every line (default for
    /// .jsonl files: "text").
    #[arg(long)]
    pub json_key: Option<String>,
    /// Total vocabulary size: 256 byte tokens + merges + special tokens.
    #[arg(long)]
    pub vocab_size: usize,
    /// Special tokens appended after the learned ones (comma-separated; never learned from).
    #[arg(long, value_delimiter = ',', default_value = "<|endoftext|>")]
    pub special_tokens: Vec<String>,
    /// Pairs seen fewer times than this are not merged (the vocabulary may then come out smaller).
    #[arg(long, default_value_t = 2)]
    pub min_frequency: u64,
    /// Where vocab.json and merges.txt are written (created if missing).
    #[arg(long)]
    pub output_dir: PathBuf,
}

/// Runs a `megatron tokenizer` subcommand.
pub fn run(cmd: &TokenizerCommand) -> Result<()> {
    match cmd {
        TokenizerCommand::Train(args) => train(args),
    }
}

fn train(a: &TrainArgs) -> Result<()> {
    let specials: Vec<String> = a.special_tokens.iter().filter(|s| !s.is_empty()).cloned().collect();
    if a.vocab_size < 256 + specials.len() {
        bail!("--vocab-size {} must be at least 256 + the {} special token(s)", a.vocab_size, specials.len());
    }
    // Checked before the corpus is read (which can take minutes), not only by the trainer.
    if a.vocab_size > MAX_VOCAB_SIZE {
        bail!("--vocab-size {} is too large: token ids are 32-bit signed, so at most {MAX_VOCAB_SIZE}", a.vocab_size);
    }
    let start = Instant::now();
    let counts = count_files(&a.input, a.json_key.as_deref(), &specials)?;
    let counted = start.elapsed().as_secs_f64();
    let options =
        BpeTrainOptions { vocab_size: a.vocab_size, special_tokens: specials, min_frequency: a.min_frequency };
    let trained = train_byte_level_bpe(&counts, &options)?;
    trained.write(&a.output_dir)?;
    println!(
        "trained byte-level BPE: {} tokens ({} merges, {} special) from {} bytes ({} distinct pre-tokens) in {:.2} s \
         (counting {counted:.2} s); wrote {}/vocab.json and merges.txt",
        trained.tokens.len(),
        trained.merges.len(),
        trained.special_ids.len(),
        counts.bytes_seen(),
        counts.distinct(),
        start.elapsed().as_secs_f64(),
        a.output_dir.display()
    );
    if trained.tokens.len() < a.vocab_size {
        println!(
            "note: fewer tokens than --vocab-size {}: no pair left with count >= --min-frequency {}",
            a.vocab_size, a.min_frequency
        );
    }
    Ok(())
}
