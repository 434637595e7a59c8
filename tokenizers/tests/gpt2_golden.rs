//! Conformance of `GPT2BPETokenizer` with the real GPT-2 files: ids of the stress documents
//! against tiktoken-checked golden ids, and a lossless round trip over tiny Shakespeare.
//! Skips (with a message) when `shared/data` is absent.

use megatron_core::registry::Registry;
use megatron_core::Tokenizer;
use megatron_tokenizers::Gpt2BpeTokenizer;
use serde::Deserialize;
use std::path::PathBuf;

fn data_dir() -> Option<PathBuf> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = manifest.ancestors().map(|a| a.join("shared/data")).find(|d| d.join("gpt2/vocab.json").is_file());
    if dir.is_none() {
        eprintln!("SKIP: shared/data/gpt2 not found above {}", manifest.display());
    }
    dir
}

fn gpt2(dir: &std::path::Path) -> anyhow::Result<Gpt2BpeTokenizer> {
    Gpt2BpeTokenizer::from_files(&dir.join("gpt2/vocab.json"), &dir.join("gpt2/merges.txt"))
}

#[derive(Deserialize)]
struct Doc {
    text: String,
}

#[derive(Deserialize)]
struct Golden {
    doc: usize,
    ids: Vec<u32>,
}

fn read_jsonl<T: for<'de> Deserialize<'de>>(path: &std::path::Path) -> anyhow::Result<Vec<T>> {
    let text = std::fs::read_to_string(path)?;
    text.lines().filter(|l| !l.trim().is_empty()).map(|l| Ok(serde_json::from_str(l)?)).collect()
}

fn check_golden(golden_file: &str, special: bool) -> anyhow::Result<()> {
    let Some(dir) = data_dir() else { return Ok(()) };
    let tok = gpt2(&dir)?;
    let docs: Vec<Doc> = read_jsonl(&dir.join("tokenizer_stress.jsonl"))?;
    let golden: Vec<Golden> = read_jsonl(&dir.join("golden").join(golden_file))?;
    assert_eq!(docs.len(), golden.len());
    let mut mismatches = vec![];
    for g in &golden {
        let text = &docs[g.doc].text;
        let ids = if special { tok.encode_with_special(text) } else { tok.encode(text)? };
        if ids != g.ids {
            mismatches.push(format!("doc {} {text:?}: got {ids:?}, want {:?}", g.doc, g.ids));
        }
        // Decoding never loses anything, whatever the split.
        assert_eq!(&tok.decode(&ids)?, text);
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} documents differ:\n{}",
        mismatches.len(),
        golden.len(),
        mismatches.join("\n")
    );
    Ok(())
}

#[test]
fn stress_documents_match_golden_ordinary_ids() -> anyhow::Result<()> {
    check_golden("tokenizer_stress.gpt2.jsonl", false)
}

#[test]
fn stress_documents_match_golden_ids_with_special_tokens() -> anyhow::Result<()> {
    check_golden("tokenizer_stress.gpt2_special.jsonl", true)
}

#[test]
fn landmark_ids_and_special_tokens() -> anyhow::Result<()> {
    let Some(dir) = data_dir() else { return Ok(()) };
    let tok = gpt2(&dir)?;
    assert_eq!(tok.vocab_size(), 50257);
    assert_eq!(tok.special_ids().eod, Some(50256));
    assert_eq!(tok.encode("Hello")?, [15496]);
    assert_eq!(tok.encode(" world")?, [995]);
    assert_eq!(tok.encode(" the")?, [262]);
    assert_eq!(tok.encode("Hello world")?, [15496, 995]);
    assert!(tok.fingerprint().starts_with("GPT2BPETokenizer:"));
    Ok(())
}

#[test]
fn tinyshakespeare_prefix_round_trips() -> anyhow::Result<()> {
    let Some(dir) = data_dir() else { return Ok(()) };
    let tok = gpt2(&dir)?;
    let bytes = std::fs::read(dir.join("tinyshakespeare.txt"))?;
    let text = String::from_utf8_lossy(&bytes[..20000.min(bytes.len())]).into_owned();
    let ids = tok.encode(&text)?;
    assert!(ids.len() > 3000 && ids.len() < 20000, "{} ids", ids.len());
    assert_eq!(ids[..3], [5962, 22307, 25], "\"First Citizen:\"");
    assert_eq!(tok.decode(&ids)?, text);
    Ok(())
}

#[test]
fn registry_builds_both_tokenizers() -> anyhow::Result<()> {
    let reg = Registry::builtin()?;
    let null = reg.tokenizer("NullTokenizer", serde_json::json!({ "vocab_size": 10 }))?;
    assert_eq!((null.vocab_size(), null.special_ids().eod), (11, Some(10)));
    let err = reg.tokenizer("NullTokenizer", serde_json::json!({ "vocab_size": 10, "vocab": 1 })).err();
    assert!(err.map(|e| e.to_string()).unwrap_or_default().contains("unknown field"));
    let Some(dir) = data_dir() else { return Ok(()) };
    let cfg =
        serde_json::json!({ "vocab_file": dir.join("gpt2/vocab.json"), "merge_file": dir.join("gpt2/merges.txt") });
    assert_eq!(reg.tokenizer("GPT2BPETokenizer", cfg)?.vocab_size(), 50257);
    let bad = serde_json::json!({ "vocab_file": "/nonexistent/vocab.json", "merge_file": "/x" });
    let err = reg.tokenizer("GPT2BPETokenizer", bad).err().map(|e| format!("{e:#}")).unwrap_or_default();
    assert!(err.contains("/nonexistent/vocab.json"), "{err}");
    Ok(())
}

/// Every document of `tinyshakespeare.jsonl`, encoded and followed by the eod, equals the
/// sequence Megatron's `preprocess_data.py --append-eod` wrote into
/// `tinyshakespeare_gpt2_text_document` (330,804 tokens). The `.idx` is read by hand here
/// (uint16, one sequence per document) to keep this crate independent of the datasets crate.
#[test]
fn tinyshakespeare_documents_match_megatrons_preprocessed_tokens() -> anyhow::Result<()> {
    let Some(dir) = data_dir() else { return Ok(()) };
    let (idx_file, bin_file) =
        (dir.join("tinyshakespeare_gpt2_text_document.idx"), dir.join("tinyshakespeare_gpt2_text_document.bin"));
    let (Ok(idx), Ok(bin)) = (std::fs::read(&idx_file), std::fs::read(&bin_file)) else {
        eprintln!("SKIP: {} or its .bin not found", idx_file.display());
        return Ok(());
    };
    assert_eq!(idx[17], 8, "uint16");
    let s = u64::from_le_bytes(idx[18..26].try_into()?) as usize;
    let lengths: Vec<usize> = (0..s)
        .map(|i| i32::from_le_bytes([idx[34 + 4 * i], idx[35 + 4 * i], idx[36 + 4 * i], idx[37 + 4 * i]]) as usize)
        .collect();
    let tokens: Vec<u32> = bin.chunks_exact(2).map(|c| u32::from(u16::from_le_bytes([c[0], c[1]]))).collect();
    let docs: Vec<Doc> = read_jsonl(&dir.join("tinyshakespeare.jsonl"))?;
    assert_eq!(docs.len(), s);
    let tok = gpt2(&dir)?;
    let mut start = 0;
    for (d, doc) in docs.iter().enumerate() {
        let mut ids = tok.encode(&doc.text)?;
        ids.push(50256);
        assert_eq!(ids, tokens[start..start + lengths[d]], "document {d}");
        start += lengths[d];
    }
    assert_eq!(start, tokens.len());
    Ok(())
}
