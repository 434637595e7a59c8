//! BERT WordPiece and GPT-2 against Hugging Face `tokenizers` on random Unicode (issue 10):
//! code points from every plane with assigned characters, combining marks, CJK, emoji, rare
//! punctuation. Ids must be identical, document for document.
//!
//! In the suite: the committed fixture `tests/data/hf_unicode.*.jsonl` (600 documents made by
//! `scripts/hf_unicode_compare.py --docs 600 --seed 11`). The 20,000-document session runs with
//! `HF_UNICODE_DIR` set (see the script). Both skip when `shared/data` (vocab files) is absent.

mod common;

use common::{data_dir, read_jsonl, Doc, Golden};
use megatron_core::Tokenizer;
use megatron_tokenizers::{BertWordPieceTokenizer, Gpt2BpeTokenizer};
use std::path::{Path, PathBuf};

/// (mismatching documents, documents, first examples).
fn compare(tok: &dyn Tokenizer, docs: &[Doc], golden: &[Golden]) -> anyhow::Result<(usize, usize, Vec<String>)> {
    assert_eq!(docs.len(), golden.len());
    let (mut bad, mut examples) = (0, vec![]);
    for g in golden {
        let text = &docs[g.doc].text;
        let ids = tok.encode(text)?;
        if ids != g.ids {
            bad += 1;
            if examples.len() < 5 {
                let cps: Vec<String> =
                    text.chars().filter(|c| !c.is_ascii()).map(|c| format!("U+{:04X}", c as u32)).collect();
                examples.push(format!(
                    "doc {} {text:?} [{}]\n  got  {ids:?}\n  want {:?}",
                    g.doc,
                    cps.join(" "),
                    g.ids
                ));
            }
        }
    }
    Ok((bad, golden.len(), examples))
}

fn run(dir: &Path, prefix: &str) -> anyhow::Result<()> {
    let Some(data) = data_dir("bert-base-uncased/vocab.txt") else { return Ok(()) };
    let docs: Vec<Doc> = read_jsonl(&dir.join(format!("{prefix}corpus.jsonl")))?;
    let bert = BertWordPieceTokenizer::from_file(&data.join("bert-base-uncased/vocab.txt"), true, 0)?;
    let gpt2 = Gpt2BpeTokenizer::from_files(&data.join("gpt2/vocab.json"), &data.join("gpt2/merges.txt"))?;
    let mut failures = vec![];
    for (name, tok) in [("bert_uncased", &bert as &dyn Tokenizer), ("gpt2", &gpt2 as &dyn Tokenizer)] {
        let golden: Vec<Golden> = read_jsonl(&dir.join(format!("{prefix}{name}.jsonl")))?;
        let (bad, n, examples) = compare(tok, &docs, &golden)?;
        println!("{name}: {bad} of {n} documents differ from Hugging Face");
        if bad > 0 {
            failures.push(format!("{name}: {bad} of {n} differ:\n{}", examples.join("\n")));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

#[test]
fn committed_fixture_matches_hugging_face() -> anyhow::Result<()> {
    run(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data"), "hf_unicode.")
}

#[test]
#[ignore = "needs HF_UNICODE_DIR from scripts/hf_unicode_compare.py"]
fn large_corpus_matches_hugging_face() -> anyhow::Result<()> {
    let dir = std::env::var("HF_UNICODE_DIR").expect("HF_UNICODE_DIR");
    run(Path::new(&dir), "")
}
