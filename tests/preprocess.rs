//! `megatron preprocess`: byte-identity with Megatron's output on tiny Shakespeare, input
//! formats (JSONL, gzip, text paragraphs), bad lines, sentence-level document indices, merging
//! and atomic outputs. Run through the library entry point with CLI-parsed flags.
#![cfg(all(feature = "datasets", feature = "tokenizers"))]

mod common;

use anyhow::Result;
use clap::Parser;
use megatron::cli::{Cli, Command};
use megatron::tools::preprocess::{self, PreprocessSummary};
use megatron_core::Registry;
use megatron_datasets::IndexedDataset;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Runs `megatron preprocess <flags>` in this process.
fn preprocess(flags: &[String]) -> Result<PreprocessSummary> {
    let mut argv = vec!["megatron".to_string(), "preprocess".to_string()];
    argv.extend(flags.iter().cloned());
    let cli = Cli::try_parse_from(argv)?;
    let Command::Preprocess(args) = cli.command else { unreachable!("parsed a preprocess command") };
    preprocess::run(&args, &Registry::builtin()?)
}

/// The full error chain of a run that must fail.
fn failure(flags: &str) -> String {
    match preprocess(&common::flags(flags)) {
        Ok(summary) => panic!("expected an error, got {summary:?}"),
        Err(e) => format!("{e:#}"),
    }
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn gpt2_flags(data: &Path) -> String {
    format!(
        "--tokenizer-type GPT2BPETokenizer --vocab-file {} --merge-file {} --append-eod",
        s(&data.join("gpt2/vocab.json")),
        s(&data.join("gpt2/merges.txt"))
    )
}

/// Asserts that `prefix.{bin,idx}` equal Megatron's tiny Shakespeare dataset byte for byte.
fn assert_golden(data: &Path, prefix: &Path) -> Result<()> {
    let golden = data.join("tinyshakespeare_gpt2_text_document");
    for ext in [".bin", ".idx"] {
        let (ours, theirs) =
            (std::fs::read(format!("{}{ext}", s(prefix)))?, std::fs::read(format!("{}{ext}", s(&golden)))?);
        assert_eq!(ours.len(), theirs.len(), "{ext} size of {}", prefix.display());
        assert!(ours == theirs, "{ext} of {} differs from Megatron's", prefix.display());
    }
    Ok(())
}

/// Names of the files in `dir`, sorted.
fn files_in(dir: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir)?.map(|e| Ok(e?.file_name().to_string_lossy().into_owned())).collect::<Result<_>>()?;
    names.sort();
    Ok(names)
}

#[test]
fn jsonl_output_is_byte_identical_to_megatron_with_one_and_two_workers() -> Result<()> {
    let Some(data) = common::shared_data() else { return Ok(()) };
    let dir = tempfile::tempdir()?;
    for workers in [1, 2] {
        let out = dir.path().join(format!("w{workers}"));
        let summary = preprocess(&common::flags(&format!(
            "--input {} --output-prefix {} {} --workers {workers} --log-interval 5000",
            s(&data.join("tinyshakespeare.jsonl")),
            s(&out),
            gpt2_flags(&data)
        )))?;
        assert_eq!(summary.documents, 7222);
        assert_eq!(summary.outputs, [PathBuf::from(format!("{}_text_document", s(&out)))]);
        assert_golden(&data, &summary.outputs[0])?;
    }
    Ok(())
}

#[test]
fn gzip_and_text_paragraph_inputs_give_the_same_dataset() -> Result<()> {
    let Some(data) = common::shared_data() else { return Ok(()) };
    let dir = tempfile::tempdir()?;
    // Two gzip members, as `cat a.gz b.gz` makes.
    let jsonl = std::fs::read(data.join("tinyshakespeare.jsonl"))?;
    let half = jsonl.len() / 2 + jsonl[jsonl.len() / 2..].iter().position(|&b| b == b'\n').unwrap_or(0) + 1;
    let gz = dir.path().join("shakespeare.jsonl.gz");
    let mut file = std::fs::File::create(&gz)?;
    for part in [&jsonl[..half], &jsonl[half..]] {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(part)?;
        file.write_all(&enc.finish()?)?;
    }
    drop(file);
    let out = dir.path().join("gz");
    let summary = preprocess(&common::flags(&format!(
        "--input {} --output-prefix {} {} --workers 2",
        s(&gz),
        s(&out),
        gpt2_flags(&data)
    )))?;
    assert_golden(&data, &summary.outputs[0])?;

    // tinyshakespeare.jsonl holds the blank-line separated paragraphs of tinyshakespeare.txt.
    let out = dir.path().join("txt");
    let summary = preprocess(&common::flags(&format!(
        "--input {} --input-format text-paragraphs --output-prefix {} {} --workers 2",
        s(&data.join("tinyshakespeare.txt")),
        s(&out),
        gpt2_flags(&data)
    )))?;
    assert_eq!(summary.documents, 7222);
    assert_golden(&data, &summary.outputs[0])
}

#[test]
fn merging_two_halves_equals_the_whole() -> Result<()> {
    let Some(data) = common::shared_data() else { return Ok(()) };
    let dir = tempfile::tempdir()?;
    let text = std::fs::read_to_string(data.join("tinyshakespeare.jsonl"))?;
    let lines: Vec<&str> = text.lines().collect();
    let parts = dir.path().join("parts");
    std::fs::create_dir(&parts)?;
    for (i, chunk) in [&lines[..3000], &lines[3000..]].into_iter().enumerate() {
        let input = dir.path().join(format!("half{i}.jsonl"));
        std::fs::write(&input, chunk.join("\n") + "\n")?;
        let flags =
            format!("--input {} --output-prefix {} {}", s(&input), s(&parts.join(format!("p{i}"))), gpt2_flags(&data));
        preprocess(&common::flags(&flags))?;
    }
    let (p0, p1) = (parts.join("p0_text_document"), parts.join("p1_text_document"));
    let merged = dir.path().join("merged");
    let summary =
        preprocess(&common::flags(&format!("--merge --input {} {} --output-prefix {}", s(&p0), s(&p1), s(&merged))))?;
    assert_eq!(summary.documents, 7222);
    assert_golden(&data, &merged)?;
    // A directory input merges its datasets in name order (merge_datasets.py --input DIR).
    let from_dir = dir.path().join("from_dir");
    preprocess(&common::flags(&format!("--merge --input {} --output-prefix {}", s(&parts), s(&from_dir))))?;
    assert_golden(&data, &from_dir)
}

/// Null-tokenizer flags: text is whitespace-separated ids, eod = 100.
const NULL: &str = "--tokenizer-type NullTokenizer --vocab-size 100";

#[test]
fn bad_lines_fail_with_their_line_number_or_are_skipped_and_counted() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("in.jsonl");
    let lines = [
        r#"{"text": "1 2 3", "title": "7"}"#,
        r#"{"text": 5, "title": "7"}"#,
        r#"{"text": "4 5", "title": "8 9"}"#,
        r#"{"text": "6", "title": "#,
        r#"{"title": "1"}"#,
        r#"{"text": "x y", "title": "1"}"#,
        r#"{"text": "", "title": "2"}"#,
    ];
    std::fs::write(&input, lines.join("\n") + "\n")?;
    let out = dir.path().join("out");
    let base = format!("--input {} --output-prefix {} {NULL} --json-keys text title --append-eod", s(&input), s(&out));

    let err = failure(&base);
    assert!(err.contains("in.jsonl` line 2") && err.contains("is a number"), "{err}");
    assert_eq!(files_in(dir.path())?, ["in.jsonl"], "a failed run leaves no output");

    let summary = preprocess(&common::flags(&format!("{base} --on-bad-line skip --workers 2")))?;
    assert_eq!(summary.skipped_lines, 4);
    let skipped: Vec<u64> = summary.first_skipped.iter().map(|(l, _)| *l).collect();
    assert_eq!(skipped, [2, 4, 5, 6]);
    assert!(summary.first_skipped[1].1.contains("invalid JSON"), "{:?}", summary.first_skipped);
    assert!(summary.first_skipped[2].1.contains("\"text\" is missing"), "{:?}", summary.first_skipped);
    assert!(summary.first_skipped[3].1.contains("cannot tokenize"), "{:?}", summary.first_skipped);
    // Lines 1, 3 and 7 remain; one dataset per key; the empty text is an empty document.
    let text = IndexedDataset::open(&summary.outputs[0])?;
    assert_eq!(text.sequence_lengths(), [4, 3]);
    assert_eq!(text.document_indices(), [0, 1, 2, 2]);
    assert_eq!(text.sequence(1)?, [4, 5, 100]);
    let title = IndexedDataset::open(&summary.outputs[1])?;
    assert_eq!(title.sequence_lengths(), [2, 3, 2]);
    assert_eq!(title.document_indices(), [0, 1, 2, 3]);
    assert!(summary.outputs[1].ends_with("out_title_document"));
    Ok(())
}

#[test]
fn sentence_level_output_has_one_sequence_per_sentence() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // Lists are pre-split sentences: empty ones are dropped, an all-empty document stays.
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, "{\"text\": [\"1 2\", \"\", \"3\"]}\n{\"text\": [\"\"]}\n{\"text\": \"4 5 6\"}\n")?;
    let out = dir.path().join("out");
    let flags = format!("--input {} --output-prefix {} {NULL} --split-sentences --append-eod", s(&input), s(&out));
    let summary = preprocess(&common::flags(&flags))?;
    assert!(summary.outputs[0].ends_with("out_text_sentence"));
    let ds = IndexedDataset::open(&summary.outputs[0])?;
    assert_eq!(ds.sequence_lengths(), [2, 2, 4]);
    assert_eq!(ds.document_indices(), [0, 2, 2, 3]);
    assert_eq!(ds.sequence(1)?, [3, 100]);

    // Real splitting with GPT-2: each sentence is tokenized on its own.
    let Some(data) = common::shared_data() else { return Ok(()) };
    let text = "Mr. Smith paid $3.50 for it. \"Really?\" she asked. Yes! It was cheap.";
    std::fs::write(&input, serde_json::json!({ "text": text }).to_string() + "\n")?;
    let summary = preprocess(&common::flags(&format!(
        "--input {} --output-prefix {} {} --split-sentences",
        s(&input),
        s(&out),
        gpt2_flags(&data)
    )))?;
    let ds = IndexedDataset::open(&summary.outputs[0])?;
    let tokenizer = Registry::builtin()?.tokenizer(
        "GPT2BPETokenizer",
        serde_json::json!({ "vocab_file": data.join("gpt2/vocab.json"), "merge_file": data.join("gpt2/merges.txt") }),
    )?;
    let sentences = ["Mr. Smith paid $3.50 for it.", "\"Really?\" she asked.", "Yes!", "It was cheap."];
    assert_eq!(ds.document_indices(), [0, 4]);
    for (i, sentence) in sentences.iter().enumerate() {
        let mut want: Vec<i64> = tokenizer.encode(sentence)?.into_iter().map(i64::from).collect();
        if i == 3 {
            want.push(50256); // --append-eod counts in the last sentence
        }
        assert_eq!(ds.sequence(i)?, want, "sentence {i}: {sentence}");
    }
    Ok(())
}

#[test]
fn a_failure_midway_leaves_no_final_named_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("in.txt");
    // Many good lines (several chunks are written) and then one the tokenizer rejects.
    let mut text: String = (0..5000).map(|i| format!("{} {}\n", i % 100, (i * 7) % 100)).collect();
    text.push_str("not-a-number\n");
    text.push_str("1 2\n");
    std::fs::write(&input, text)?;
    let out = dir.path().join("out");
    let err = failure(&format!("--input {} --output-prefix {} {NULL} --workers 2", s(&input), s(&out)));
    assert!(err.contains("line 5001"), "{err}");
    assert_eq!(files_in(dir.path())?, ["in.txt"]);

    // Merging datasets of different dtypes fails the same way.
    let small = dir.path().join("small");
    std::fs::write(&input, "1 2\n\n3\n")?;
    let summary = preprocess(&common::flags(&format!("--input {} --output-prefix {} {NULL}", s(&input), s(&small))))?;
    assert_eq!((summary.documents, summary.blank_lines), (2, 1));
    let big = dir.path().join("big");
    preprocess(&common::flags(&format!(
        "--input {} --output-prefix {} --tokenizer-type NullTokenizer --vocab-size 70000",
        s(&input),
        s(&big)
    )))?;
    let merged = dir.path().join("merged");
    let err = failure(&format!(
        "--merge --input {} {} --output-prefix {}",
        s(&summary.outputs[0]),
        s(&dir.path().join("big_text_document")),
        s(&merged)
    ));
    assert!(err.contains("dtype"), "{err}");
    assert!(!files_in(dir.path())?.iter().any(|f| f.starts_with("merged")));
    Ok(())
}

#[test]
fn invalid_flags_are_reported_together() {
    let err = failure("--input a.jsonl b.jsonl --output-prefix /nonexistent-dir/x --workers 0");
    for needle in ["exactly one --input", "--tokenizer-type is required", "--workers must be > 0", "does not exist"] {
        assert!(err.contains(needle), "missing `{needle}` in: {err}");
    }
}

#[test]
fn other_tokenizers_get_only_the_flags_given() -> Result<()> {
    let Some(data) = common::shared_data() else { return Ok(()) };
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, "{\"text\": \"Hello World. It is late.\"}\n")?;
    let vocab = data.join("bert-base-uncased/vocab.txt");
    let summary = preprocess(&common::flags(&format!(
        "--input {} --output-prefix {} --tokenizer-type BertWordPieceLowerCase --vocab-file {} --split-sentences",
        s(&input),
        s(&dir.path().join("bert")),
        s(&vocab)
    )))?;
    let tokenizer =
        Registry::builtin()?.tokenizer("BertWordPieceLowerCase", serde_json::json!({ "vocab_file": vocab }))?;
    let ds = IndexedDataset::open(&summary.outputs[0])?;
    assert_eq!(ds.dtype(), megatron_datasets::TokenDType::U16);
    assert_eq!(ds.document_indices(), [0, 2]);
    // Current Megatron wraps every tokenizer call (here each sentence) in [CLS] … [SEP].
    let plain: Vec<i64> = tokenizer.encode("It is late.")?.into_iter().map(i64::from).collect();
    let wrapped: Vec<i64> = [101].into_iter().chain(plain.iter().copied()).chain([102]).collect();
    assert_eq!(ds.sequence(1)?, wrapped);
    // --tokenizer-hf-no-include-special-tokens turns it off.
    let summary = preprocess(&common::flags(&format!(
        "--input {} --output-prefix {} --tokenizer-type BertWordPieceLowerCase --vocab-file {} --split-sentences \
         --tokenizer-hf-no-include-special-tokens",
        s(&input),
        s(&dir.path().join("bert_plain")),
        s(&vocab)
    )))?;
    assert_eq!(IndexedDataset::open(&summary.outputs[0])?.sequence(1)?, plain);
    Ok(())
}

/// Whole documents against Hugging Face `tokenizers` with special tokens (the shared golden
/// `tokenizer_stress.bert_uncased_special.jsonl`, made with `tokenizer(text).input_ids`).
#[test]
fn bert_documents_match_hugging_face_with_special_tokens() -> Result<()> {
    let Some(data) = common::shared_data() else { return Ok(()) };
    let dir = tempfile::tempdir()?;
    let summary = preprocess(&common::flags(&format!(
        "--input {} --output-prefix {} --tokenizer-type BertWordPieceLowerCase --vocab-file {}",
        s(&data.join("tokenizer_stress.jsonl")),
        s(&dir.path().join("bert")),
        s(&data.join("bert-base-uncased/vocab.txt"))
    )))?;
    let ds = IndexedDataset::open(&summary.outputs[0])?;
    let golden = std::fs::read_to_string(data.join("golden/tokenizer_stress.bert_uncased_special.jsonl"))?;
    let mut n = 0;
    for (i, line) in golden.lines().enumerate() {
        let want: Vec<i64> = serde_json::from_str::<serde_json::Value>(line)?["ids"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_i64()).collect())
            .unwrap_or_default();
        assert_eq!(ds.sequence(i)?, want, "document {i}");
        n += 1;
    }
    assert_eq!(n, ds.len());
    Ok(())
}
