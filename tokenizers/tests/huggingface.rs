//! `HuggingFaceTokenizer` (feature `huggingface`): a `tokenizer.json` built here with the
//! `tokenizers` crate from the raw GPT-2 / BERT files (as `shared/tools/ref_tokenize.py` does)
//! must reproduce the goldens through our plugin, with special ids from its added tokens.
//! Run with `cargo test -p megatron-tokenizers --features huggingface`. Skips without data.
#![cfg(feature = "huggingface")]

mod common;

use common::{data_dir, read_jsonl, Doc, Golden};
use megatron_core::registry::Registry;
// Referenced so the linker keeps this crate's plugin registration.
use megatron_tokenizers as _;
use std::path::{Path, PathBuf};
use tokenizers::models::bpe::BPE;
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, Tokenizer};

type BoxErr = Box<dyn std::error::Error + Send + Sync>;

fn scratch_dir(name: &str) -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("megatron-hf-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn gpt2_json(data: &Path, out: &Path) -> Result<(), BoxErr> {
    let (v, m) = (data.join("gpt2/vocab.json"), data.join("gpt2/merges.txt"));
    let bpe = BPE::from_file(&v.to_string_lossy(), &m.to_string_lossy()).build()?;
    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, false, true)));
    tok.with_decoder(Some(ByteLevel::default()));
    tok.add_special_tokens(&[AddedToken::from("<|endoftext|>", true)]);
    tok.save(out, false)
}

fn bert_json(data: &Path, out: &Path) -> Result<(), BoxErr> {
    let vocab = data.join("bert-base-uncased/vocab.txt");
    let wp = WordPiece::from_file(&vocab.to_string_lossy()).unk_token("[UNK]".into()).build()?;
    let mut tok = Tokenizer::new(wp);
    tok.with_normalizer(Some(BertNormalizer::new(true, true, None, true)));
    tok.with_pre_tokenizer(Some(BertPreTokenizer));
    let post = TemplateProcessing::builder()
        .try_single("[CLS] $A [SEP]")?
        .special_tokens(vec![("[CLS]", 101), ("[SEP]", 102)])
        .build()?;
    tok.with_post_processor(Some(post));
    tok.add_special_tokens(&["[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]"].map(|t| AddedToken::from(t, true)));
    tok.save(out, false)
}

fn check(tok: &dyn megatron_core::Tokenizer, data: &Path, golden_file: &str) -> anyhow::Result<()> {
    let docs: Vec<Doc> = read_jsonl(&data.join("tokenizer_stress.jsonl"))?;
    let golden: Vec<Golden> = read_jsonl(&data.join("golden").join(golden_file))?;
    for g in &golden {
        assert_eq!(tok.encode(&docs[g.doc].text)?, g.ids, "{golden_file} doc {}", g.doc);
    }
    Ok(())
}

#[test]
fn gpt2_tokenizer_json_matches_goldens() -> anyhow::Result<()> {
    let Some(data) = data_dir("gpt2/vocab.json") else { return Ok(()) };
    let dir = scratch_dir("gpt2")?;
    gpt2_json(&data, &dir.join("tokenizer.json")).map_err(|e| anyhow::anyhow!("{e}"))?;
    let reg = Registry::builtin()?;
    // A directory works as well as the file.
    let tok = reg.tokenizer("HuggingFaceTokenizer", serde_json::json!({ "tokenizer_model": dir }))?;
    check(tok.as_ref(), &data, "tokenizer_stress.gpt2_special.jsonl")?;
    assert_eq!(tok.vocab_size(), 50257);
    assert_eq!((tok.special_ids().eod, tok.special_ids().pad), (Some(50256), None));
    assert_eq!(tok.decode(&tok.encode("Hello world<|endoftext|>")?)?, "Hello world<|endoftext|>");
    assert!(tok.decode(&[50257]).is_err());
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[test]
fn bert_tokenizer_json_matches_goldens_and_names_special_ids() -> anyhow::Result<()> {
    let Some(data) = data_dir("bert-base-uncased/vocab.txt") else { return Ok(()) };
    let dir = scratch_dir("bert")?;
    let file = dir.join("tokenizer.json");
    bert_json(&data, &file).map_err(|e| anyhow::anyhow!("{e}"))?;
    let reg = Registry::builtin()?;
    let with = reg.tokenizer("HuggingFaceTokenizer", serde_json::json!({ "tokenizer_model": file }))?;
    check(with.as_ref(), &data, "tokenizer_stress.bert_uncased_special.jsonl")?;
    let s = with.special_ids();
    assert_eq!((s.cls, s.sep, s.pad, s.mask, s.eod), (Some(101), Some(102), Some(0), Some(103), None));
    let cfg = serde_json::json!({ "tokenizer_model": file, "add_special_tokens": false });
    check(reg.tokenizer("HuggingFaceTokenizer", cfg)?.as_ref(), &data, "tokenizer_stress.bert_uncased.jsonl")?;
    // tokenizer_config.json beside it names the eos, as AutoTokenizer reads it.
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"eos_token": {"content": "[SEP]"}}"#)?;
    let named = reg.tokenizer("HuggingFaceTokenizer", serde_json::json!({ "tokenizer_model": file }))?;
    assert_eq!(named.special_ids().eod, Some(102));
    let err = reg
        .tokenizer("HuggingFaceTokenizer", serde_json::json!({ "tokenizer_model": dir.join("missing.json") }))
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(err.contains("missing.json") && err.contains("--tokenizer-model"), "{err}");
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
