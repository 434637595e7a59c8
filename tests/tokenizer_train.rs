//! `megatron tokenizer train` through the CLI parser: trains on a small JSONL corpus, writes
//! GPT-2-format files, and the result loads through the registry as `GPT2BPETokenizer`.
#![cfg(feature = "tokenizers")]

use clap::Parser;
use megatron::cli::{run, Cli};
use megatron_core::Registry;

#[test]
fn tokenizer_train_writes_files_gpt2_bpe_can_load() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("corpus.jsonl");
    let docs: Vec<String> = (0..50)
        .map(|i| serde_json::json!({ "body": format!("the cat {i} sat on the mat, the end<|endoftext|>") }).to_string())
        .collect();
    std::fs::write(&input, docs.join("\n"))?;
    let out = dir.path().join("tok");
    let args = ["megatron", "tokenizer", "train", "--input", &input.to_string_lossy(), "--json-key", "body"];
    let cli = Cli::try_parse_from(args.iter().copied().chain([
        "--vocab-size",
        "270",
        "--output-dir",
        &out.to_string_lossy(),
    ]))?;
    run(cli)?;
    let merges = std::fs::read_to_string(out.join("merges.txt"))?;
    assert!(merges.starts_with("#version: 0.2\n"));
    let cfg = serde_json::json!({ "vocab_file": out.join("vocab.json"), "merge_file": out.join("merges.txt") });
    let tok = Registry::builtin()?.tokenizer("GPT2BPETokenizer", cfg)?;
    assert_eq!(tok.vocab_size(), 270);
    let ids = tok.encode("the cat sat on the mat")?;
    assert!(ids.len() < 8, "{ids:?}");
    assert_eq!(tok.decode(&ids)?, "the cat sat on the mat");
    // A wrong key is reported with the file and line.
    let bad = Cli::try_parse_from(
        args.iter().copied().chain(["--vocab-size", "270", "--output-dir", &out.to_string_lossy()]).map(|a| {
            if a == "body" {
                "text"
            } else {
                a
            }
        }),
    )?;
    let err = run(bad).err().map(|e| format!("{e:#}")).unwrap_or_default();
    assert!(err.contains("corpus.jsonl") && err.contains("line 1"), "{err}");
    Ok(())
}
