//! Conformance of `BertWordPieceLowerCase` with bert-base-uncased: ids of the stress documents
//! against the Hugging Face goldens (plain, and `[CLS] … [SEP]`), Megatron's special ids, and
//! registry construction. Skips when `shared/data` is absent.

mod common;

use common::{data_dir, read_jsonl, Doc, Golden};
use megatron_core::registry::Registry;
use megatron_core::Tokenizer;
use megatron_tokenizers::BertWordPieceTokenizer;

const VOCAB: &str = "bert-base-uncased/vocab.txt";

fn check_golden(golden_file: &str, special: bool) -> anyhow::Result<()> {
    let Some(dir) = data_dir(VOCAB) else { return Ok(()) };
    let tok = BertWordPieceTokenizer::from_file(&dir.join(VOCAB), true, 0)?;
    let docs: Vec<Doc> = read_jsonl(&dir.join("tokenizer_stress.jsonl"))?;
    let golden: Vec<Golden> = read_jsonl(&dir.join("golden").join(golden_file))?;
    assert_eq!(docs.len(), golden.len());
    let mut mismatches = vec![];
    for g in &golden {
        let text = &docs[g.doc].text;
        let ids = if special { tok.encode_with_special(text) } else { tok.encode(text)? };
        if ids != g.ids {
            mismatches.push(format!("doc {} {text:?}:\n  got  {ids:?}\n  want {:?}", g.doc, g.ids));
        }
    }
    assert!(mismatches.is_empty(), "{} of {} differ:\n{}", mismatches.len(), golden.len(), mismatches.join("\n"));
    Ok(())
}

#[test]
fn stress_documents_match_golden_ids() -> anyhow::Result<()> {
    check_golden("tokenizer_stress.bert_uncased.jsonl", false)
}

#[test]
fn stress_documents_match_golden_ids_with_cls_sep() -> anyhow::Result<()> {
    check_golden("tokenizer_stress.bert_uncased_special.jsonl", true)
}

#[test]
fn megatron_special_ids_and_landmarks() -> anyhow::Result<()> {
    let Some(dir) = data_dir(VOCAB) else { return Ok(()) };
    let tok = BertWordPieceTokenizer::from_file(&dir.join(VOCAB), true, 2)?;
    let s = tok.special_ids();
    assert_eq!((s.pad, s.cls, s.sep, s.mask), (Some(0), Some(101), Some(102), Some(103)));
    // Megatron appends [BOS], [EOS] (missing from bert-base-uncased), eod = eos, then sentinels.
    assert_eq!((s.bos, s.eos, s.eod), (Some(30522), Some(30523), Some(30523)));
    assert_eq!(tok.vocab_size(), 30522 + 2 + 2);
    assert_eq!(tok.unk_id(), 100);
    assert_eq!(tok.encode("the")?, [1996]);
    assert_eq!(tok.decode(&tok.encode("Unaffable running, THE end.")?)?, "unaffable running , the end .");
    Ok(())
}

#[test]
fn registry_builds_both_bert_tokenizers() -> anyhow::Result<()> {
    let reg = Registry::builtin()?;
    let bad = serde_json::json!({ "vocab_file": "/nonexistent/vocab.txt" });
    let err = reg.tokenizer("BertWordPieceLowerCase", bad).err().map(|e| format!("{e:#}")).unwrap_or_default();
    assert!(err.contains("/nonexistent/vocab.txt"), "{err}");
    let unknown = serde_json::json!({ "vocab_file": "v.txt", "lower_case": true });
    let err = reg.tokenizer("BertWordPieceCase", unknown).err().map(|e| format!("{e:#}")).unwrap_or_default();
    assert!(err.contains("unknown field"), "{err}");
    let Some(dir) = data_dir(VOCAB) else { return Ok(()) };
    let cfg = serde_json::json!({ "vocab_file": dir.join(VOCAB) });
    let lower = reg.tokenizer("BertWordPieceLowerCase", cfg.clone())?;
    let case = reg.tokenizer("BertWordPieceCase", cfg)?;
    assert_eq!((lower.name(), case.name()), ("BertWordPieceLowerCase", "BertWordPieceCase"));
    // The uncased vocab has no capitalised "Hello": the cased tokenizer must split or [UNK] it.
    assert_eq!(lower.encode("Hello")?, [7592]);
    assert_ne!(case.encode("Hello")?, [7592]);
    assert_ne!(lower.fingerprint(), case.fingerprint());
    Ok(())
}
