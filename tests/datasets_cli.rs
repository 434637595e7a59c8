//! `megatron data inspect` and the data flags of `megatron pretrain` (blends, per-split paths,
//! `--data-cache-path`) end to end.

mod common;

use clap::Parser;
use megatron::cli::{Cli, Command};
use megatron::tools::data_inspect::{inspect, DataCommand};
use megatron_core::Registry;
use megatron_datasets::npy::read_npy;
use megatron_datasets::{IndexedDatasetBuilder, TokenDType};
use std::path::Path;

fn inspect_output(argv: &[&str]) -> anyhow::Result<String> {
    let mut full = vec!["megatron", "data", "inspect"];
    full.extend_from_slice(argv);
    let cli = Cli::try_parse_from(full)?;
    let Command::Data { command: DataCommand::Inspect(args) } = cli.command else {
        anyhow::bail!("parsed another command")
    };
    inspect(&args, &Registry::builtin()?)
}

#[test]
fn inspect_summarises_tinyshakespeare_and_dumps_megatron_indices() -> anyhow::Result<()> {
    let Some(data) = common::shared_data() else { return Ok(()) };
    let prefix = data.join("tinyshakespeare_gpt2_text_document");
    if !prefix.with_extension("idx").is_file() {
        eprintln!("SKIP: {} is absent", prefix.display());
        return Ok(());
    }
    let dump = tempfile::tempdir()?;
    let p = prefix.to_string_lossy().into_owned();
    let d = dump.path().to_string_lossy().into_owned();
    let (vocab, merges) = (data.join("gpt2/vocab.json"), data.join("gpt2/merges.txt"));
    let mut argv = vec![p.as_str(), "--seq-length", "64", "--show", "2", "--dump-indices", d.as_str()];
    let (v, m) = (vocab.to_string_lossy().into_owned(), merges.to_string_lossy().into_owned());
    let with_tokenizer = vocab.is_file() && merges.is_file();
    if with_tokenizer {
        argv.extend(["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", v.as_str(), "--merge-file", m.as_str()]);
    }
    let out = inspect_output(&argv)?;
    assert!(out.contains("documents    7222"), "{out}");
    assert!(out.contains("tokens       330804"), "{out}");
    assert!(out.contains("dtype        uint16"), "{out}");
    // round(0.969 * 7222) = 6998.
    assert!(out.contains("sequences [0, 6998)"), "{out}");
    assert_eq!(out.matches("\nsample ").count(), 2, "{out}");
    if with_tokenizer {
        assert!(out.contains("  text       \""), "{out}");
    }
    // The dumped indices: one epoch of the train split, windows of 64 + 1 tokens.
    let find = |affix: &str| -> anyhow::Result<std::path::PathBuf> {
        std::fs::read_dir(dump.path())?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.to_string_lossy().ends_with(affix))
            .ok_or_else(|| anyhow::anyhow!("no *{affix} written"))
    };
    let doc = read_npy(&find("-GPTDataset-train-document_index.npy")?)?;
    let mut sorted = doc.data.clone();
    sorted.sort();
    assert_eq!(sorted, (0..6998).collect::<Vec<i64>>());
    let sample = read_npy(&find("-GPTDataset-train-sample_index.npy")?)?;
    let shuffle = read_npy(&find("-GPTDataset-train-shuffle_index.npy")?)?;
    assert_eq!(sample.shape[1], 2);
    assert_eq!(shuffle.shape[0] + 1, sample.shape[0]);
    assert!(out.contains(&format!("samples      {} of seq_length 64", shuffle.shape[0])), "{out}");
    Ok(())
}

/// Documents of tokens `1..n` (each < 100, so a NullTokenizer of 100 ids covers them).
fn write_small(prefix: &Path, docs: usize, seed: usize) -> anyhow::Result<()> {
    let mut w = IndexedDatasetBuilder::create(prefix, TokenDType::U16)?;
    for d in 0..docs {
        let n = 5 + (d * 7 + seed) % 23;
        let doc: Vec<u16> = (0..n).map(|p| ((d + p + seed) % 97 + 1) as u16).collect();
        w.add_item(&doc)?;
        w.end_document();
    }
    w.finalize()
}

fn data_flags(data: &str) -> Vec<String> {
    let mut flags: Vec<String> = common::tiny_mock_flags().into_iter().filter(|f| f != "--mock-data").collect();
    flags.extend(common::flags("--train-iters 4 --tokenizer-type NullTokenizer"));
    flags.extend(common::flags(data));
    flags
}

fn npy_files(dir: &Path) -> anyhow::Result<Vec<(String, std::time::SystemTime)>> {
    let mut v = vec![];
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        v.push((e.file_name().to_string_lossy().into_owned(), e.metadata()?.modified()?));
    }
    v.sort();
    Ok(v)
}

#[test]
fn pretrain_on_a_cached_blend_and_on_per_split_paths() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (a, b) = (dir.path().join("a_text_document"), dir.path().join("b_text_document"));
    write_small(&a, 300, 0)?;
    write_small(&b, 200, 3)?;
    let cache = dir.path().join("cache");
    let (a, b, c) = (a.to_string_lossy(), b.to_string_lossy(), cache.to_string_lossy());
    let flags = data_flags(&format!("--data-path 0.3 {a} 0.7 {b} --split 90,5,5 --data-cache-path {c}"));
    let first = common::pretrain(&flags)?;
    assert_eq!(first.final_iteration, 4);
    let files = npy_files(&cache)?;
    let count = |class: &str| files.iter().filter(|(n, _)| n.contains(class)).count();
    // GPT: 4 files x 2 prefixes x 3 splits; blends: 3 files x 3 splits.
    assert_eq!((count("-GPTDataset-"), count("-BlendedDataset-")), (24, 9), "{files:?}");
    let second = common::pretrain(&flags)?;
    assert_eq!(second.final_iteration, 4);
    assert_eq!(npy_files(&cache)?, files, "the second run reads the cache without rewriting it");

    let per_split = data_flags(&format!("--train-data-path {a} {b} --valid-data-path {b} --test-data-path {a}"));
    assert_eq!(common::pretrain(&per_split)?.final_iteration, 4);
    // Without --data-cache-path the GPT indices are cached next to each prefix.
    assert!(Path::new(&*a).join("cache/GPTDataset_indices").is_dir());
    let both = data_flags(&format!("--data-path {a} --train-data-path {b}"));
    let err = common::pretrain(&both).err().map(|e| format!("{e:#}")).unwrap_or_default();
    assert!(err.contains("exactly one data source"), "{err}");
    Ok(())
}

/// Issue 10: the cache is named by Megatron-LM main's tokenizer description, including
/// `include_special_tokens` from --tokenizer-hf-no-include-special-tokens.
#[test]
fn cache_description_is_megatron_mains_and_follows_the_special_tokens_flag() -> anyhow::Result<()> {
    let Some(data) = common::shared_data() else { return Ok(()) };
    let vocab = data.join("bert-base-uncased/vocab.txt");
    let dir = tempfile::tempdir()?;
    let a = dir.path().join("a_text_document");
    write_small(&a, 120, 0)?;
    for (flag, want) in [
        ("", "\"include_special_tokens\": \"True\""),
        ("--tokenizer-hf-no-include-special-tokens", "\"include_special_tokens\": \"False\""),
    ] {
        let cache = dir.path().join(format!("cache{}", flag.len()));
        let mut flags: Vec<String> = data_flags(&format!(
            "--data-path {} --split 90,5,5 --data-cache-path {} --vocab-file {} {flag}",
            a.display(),
            cache.display(),
            vocab.display()
        ));
        // BERT instead of the Null tokenizer (and without its --vocab-size).
        let pos = flags.iter().position(|f| f == "--vocab-size").expect("tiny flags set --vocab-size");
        flags.drain(pos..pos + 2);
        let t = flags.iter().position(|f| f == "NullTokenizer").expect("data_flags set NullTokenizer");
        flags[t] = "BertWordPieceLowerCase".into();
        common::pretrain(&flags)?;
        let desc = std::fs::read_dir(&cache)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.to_string_lossy().ends_with("-GPTDataset-train-description.txt"))
            .ok_or_else(|| anyhow::anyhow!("no description written"))?;
        let text = std::fs::read_to_string(desc)?;
        assert!(
            text.contains("\"class\": \"megatron.core.tokenizers.text.text_tokenizer.MegatronTokenizerText\""),
            "{text}"
        );
        assert!(text.contains("\"tokenizer_path\": \"BertWordPieceLowerCase\""), "{text}");
        assert!(text.contains(want), "{text}");
    }
    Ok(())
}
