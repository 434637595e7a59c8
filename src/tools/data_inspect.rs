//! `megatron data inspect PREFIX`: what Megatron's `GPTDataset` would make of one indexed
//! dataset — its size and dtype, the `--split` range of the chosen split, the epochs and
//! samples for a sequence length and sample count, the first samples as token ids and (with a
//! tokenizer) text — and, with `--dump-indices DIR`, the document/sample/shuffle indices as
//! `.npy` files under Megatron's cache names, for `numpy.load` comparison with a Megatron run.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use megatron_core::{Dataset, Registry, Tokenizer};
use megatron_datasets::gpt::cached::{to_arrays, GPT_ARRAYS};
use megatron_datasets::gpt::{epoch_plan, GptDescription, GptSplitConfig, IndexSpec};
use megatron_datasets::npy::{write_atomic, write_npy};
use megatron_datasets::split::{parse_split, split_bookends, split_ranges, DEFAULT_SPLIT, SPLIT_NAMES};
use megatron_datasets::{GptDataset, IndexedDataset, TokenizerDescription};
use std::path::PathBuf;
use std::sync::Arc;

/// `megatron data ...`.
#[derive(Subcommand, Debug, Clone)]
pub enum DataCommand {
    /// Summarise an indexed dataset and the GPT samples Megatron would draw from it.
    Inspect(InspectArgs),
}

/// `megatron data inspect` flags (Megatron's names where Megatron has them).
#[derive(Args, Debug, Clone)]
pub struct InspectArgs {
    /// Dataset prefix (the path without `.bin`/`.idx`).
    pub prefix: String,
    /// Which split to inspect: train, valid or test.
    #[arg(long, default_value = "train")]
    pub split: String,
    /// Megatron's `--split` weights.
    #[arg(long, default_value = DEFAULT_SPLIT)]
    pub split_string: String,
    #[arg(long, default_value_t = 1024)]
    pub seq_length: usize,
    /// Requested samples (as `--train-samples`); without it, one epoch.
    #[arg(long)]
    pub num_samples: Option<u64>,
    #[arg(long, default_value_t = 1234)]
    pub seed: u64,
    /// Samples to print.
    #[arg(long, default_value_t = 3)]
    pub show: usize,
    /// Write the three index arrays (and the description) here as Megatron names them.
    #[arg(long)]
    pub dump_indices: Option<PathBuf>,
    /// `gpt` (default): GPT samples. `t5`: the span-corruption samples of Megatron's T5 dataset
    /// (src/tools/data_inspect_t5.rs; `--seq-length` is then the encoder length). `bert`:
    /// Megatron's BERT samples of a sentence-split prefix, masked positions shown
    /// (src/tools/bert_inspect.rs).
    #[arg(long, default_value = "gpt")]
    pub model: String,
    /// T5: decoder sequence length.
    #[arg(long, default_value_t = 128)]
    pub decoder_seq_length: usize,
    /// T5: masked fraction and mean span length over the first N samples.
    #[arg(long, default_value_t = 0)]
    pub stats: usize,
    /// The tokenizer to decode samples with (src/tokenizer_flags.rs).
    #[command(flatten)]
    pub tokenizer: crate::tokenizer_flags::TokenizerArgs,
    /// With `--model bert`: samples without the sentence-order split.
    #[arg(long)]
    pub bert_no_binary_head: bool,
}

/// Runs `megatron data <command>`.
pub fn run(cmd: &DataCommand, registry: &Registry) -> Result<()> {
    match cmd {
        DataCommand::Inspect(args) => print!("{}", inspect(args, registry)?),
    }
    Ok(())
}

fn tokenizer(a: &InspectArgs, registry: &Registry) -> Result<Option<Arc<dyn Tokenizer>>> {
    let Some(t) = &a.tokenizer.tokenizer_type else { return Ok(None) };
    let cfg = a.tokenizer.flags().config();
    let tok = registry
        .tokenizer(t, cfg)
        .with_context(|| format!("building tokenizer {t} from --vocab-file/--merge-file/--vocab-size"))?;
    Ok(Some(tok))
}

/// The report `megatron data inspect` prints.
pub fn inspect(a: &InspectArgs, registry: &Registry) -> Result<String> {
    use std::fmt::Write;
    if a.model == "t5" {
        return super::data_inspect_t5::inspect(a, registry);
    }
    let k = SPLIT_NAMES
        .iter()
        .position(|s| *s == a.split)
        .ok_or_else(|| anyhow!("--split {:?}: expected one of train, valid, test", a.split))?;
    let seed = u32::try_from(a.seed).map_err(|_| anyhow!("--seed {} must fit in 32 bits", a.seed))?;
    if a.seq_length == 0 {
        bail!("--seq-length must be at least 1");
    }
    let tok = tokenizer(a, registry)?;
    if a.model == "bert" {
        return super::bert_inspect::inspect(a, tok.as_deref());
    }
    let data = Arc::new(IndexedDataset::open(&a.prefix)?);
    let mut out = String::new();
    let w = &mut out;
    writeln!(w, "dataset      {}", a.prefix)?;
    writeln!(w, "dtype        {}", data.dtype())?;
    writeln!(w, "documents    {}", data.num_documents())?;
    writeln!(w, "sequences    {}", data.len())?;
    writeln!(w, "tokens       {}", data.num_tokens())?;
    let range = split_ranges(&a.split_string, data.len())?[k]
        .clone()
        .filter(|r| !r.is_empty())
        .ok_or_else(|| anyhow!("--split-string {:?} gives the {} split no sequences", a.split_string, a.split))?;
    let split_tokens: u64 = data.sequence_lengths()[range.clone()].iter().map(|&l| l as u64).sum();
    writeln!(
        w,
        "split        {} of {:?}: sequences [{}, {}) ({} sequences, {split_tokens} tokens)",
        a.split,
        a.split_string,
        range.start,
        range.end,
        range.len()
    )?;

    let indices: Vec<i32> = range.clone().map(|i| i as i32).collect();
    let spec = IndexSpec {
        sizes: data.sequence_lengths(),
        indices: &indices,
        seq_length: a.seq_length,
        num_samples: a.num_samples.map(|n| n as usize),
        seed,
        add_extra_token: true,
        drop_last_partial: true,
    };
    let plan = epoch_plan(&spec)?;
    writeln!(
        w,
        "samples      {} of seq_length {} (requested {}; {} epoch(s), separate final epoch: {})",
        plan.num_samples,
        a.seq_length,
        a.num_samples.map_or("one epoch".to_string(), |n| n.to_string()),
        plan.num_epochs,
        plan.separate_final_epoch
    )?;

    let config = GptSplitConfig {
        split_name: a.split.clone(),
        sequences: range,
        seq_length: a.seq_length,
        num_samples: spec.num_samples,
        seed,
        drop_last_partial: true,
    };
    let ds = GptDataset::new(data.clone(), &config)?;
    for i in 0..a.show.min(ds.len()) {
        let s = ds.get(i)?;
        let mut text = s.tokens.clone();
        text.extend(s.labels.last());
        writeln!(w, "sample {i}     window {} tokens {:?}", ds.indices().shuffle_index[i], text)?;
        if let Some(t) = &tok {
            let ids: Vec<u32> = text.iter().map(|&v| v as u32).collect();
            writeln!(w, "  text       {:?}", t.decode(&ids)?)?;
        }
    }

    if let Some(dir) = &a.dump_indices {
        let tokenizer_desc = a.tokenizer.tokenizer_type.as_deref().and_then(|t| {
            let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.to_string_lossy().into_owned());
            TokenizerDescription::for_megatron_type(
                t,
                path(&a.tokenizer.vocab_file).as_deref(),
                path(&a.tokenizer.merge_file).as_deref(),
                a.tokenizer.vocab_size,
            )
        });
        let description = GptDescription {
            dataset_path: &a.prefix,
            num_samples: a.num_samples,
            index_split: SPLIT_NAMES[k],
            random_seed: a.seed,
            sequence_length: a.seq_length,
            split: Some(&a.split_string),
            split_matrix: Some(split_bookends(parse_split(&a.split_string)?)),
            tokenizer: tokenizer_desc.as_ref(),
        };
        let (text, hash) = description.text_and_hash();
        std::fs::create_dir_all(dir).with_context(|| format!("--dump-indices: cannot create `{}`", dir.display()))?;
        let base = format!("{hash}-GPTDataset-{}", a.split);
        for (name, array) in GPT_ARRAYS.iter().zip(to_arrays(ds.indices(), data.sequence_lengths())?) {
            let path = dir.join(format!("{base}-{name}.npy"));
            write_npy(&path, &array)?;
            writeln!(w, "wrote        {} ({} {:?})", path.display(), array.dtype.descr(), array.shape)?;
        }
        let path = dir.join(format!("{base}-description.txt"));
        write_atomic(&path, text.as_bytes())?;
        writeln!(w, "wrote        {}", path.display())?;
    }
    Ok(out)
}
