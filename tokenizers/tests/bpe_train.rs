//! The byte-level BPE trainer end to end: train on text, write `vocab.json` + `merges.txt`,
//! load them with `GPT2BPETokenizer`, and check the round trip and the compression. The
//! tiny-Shakespeare part skips when `shared/data` is absent.

mod common;

use common::{data_dir, Rng};
use megatron_core::Tokenizer;
use megatron_tokenizers::bpe_train::{count_files, train_byte_level_bpe, BpeTrainOptions, WordCounts};
use megatron_tokenizers::Gpt2BpeTokenizer;
use std::path::PathBuf;

fn scratch_dir(name: &str) -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("megatron-bpe-train-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn options(vocab_size: usize) -> BpeTrainOptions {
    BpeTrainOptions { vocab_size, special_tokens: vec!["<|endoftext|>".into()], min_frequency: 2 }
}

#[test]
fn trained_files_load_as_gpt2_and_compress_training_words() -> anyhow::Result<()> {
    let text = "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs.\n\
                Quick thinking, quick foxes! Über naïve café 日本語 😀😀 — the end.<|endoftext|>";
    let mut counts = WordCounts::new(&["<|endoftext|>".to_string()]);
    for _ in 0..5 {
        counts.add_text(text);
    }
    let trained = train_byte_level_bpe(&counts, &options(400))?;
    let dir = scratch_dir("small")?;
    trained.write(&dir)?;
    assert!(!dir.join("vocab.tmp").exists() && !dir.join("merges.tmp").exists(), "temp files left behind");
    let tok = Gpt2BpeTokenizer::from_files(&dir.join("vocab.json"), &dir.join("merges.txt"))?;
    assert_eq!(tok.vocab_size(), trained.tokens.len());
    assert_eq!(tok.special_ids().eod, Some(trained.tokens.len() as u32 - 1));
    assert_eq!(tok.encode_with_special("fox<|endoftext|>").last().copied(), tok.special_ids().eod);
    for word in [" quick", " fox", "The", " the", " café"] {
        let ids = tok.encode(word)?;
        assert!(ids.len() < word.len(), "{word:?} → {ids:?}: training words must compress");
    }
    let mut rng = Rng(3);
    for probe in [text, "unseen words ★ and bytes \u{0}\t\r\n", "ＦＵＬＬＷＩＤＴＨ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢"]
    {
        assert_eq!(tok.decode(&tok.encode(probe)?)?, probe);
        let cut = probe.char_indices().nth(rng.below(probe.chars().count())).map_or(0, |(i, _)| i);
        assert_eq!(tok.decode(&tok.encode(&probe[cut..])?)?, &probe[cut..]);
    }
    // Deterministic: training again gives byte-identical files.
    let again = train_byte_level_bpe(&counts, &options(400))?;
    assert_eq!((again.vocab_json(), again.merges_txt()), (trained.vocab_json(), trained.merges_txt()));
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[test]
fn jsonl_inputs_use_the_key_and_errors_name_the_line() -> anyhow::Result<()> {
    let dir = scratch_dir("jsonl")?;
    let good = dir.join("good.jsonl");
    std::fs::write(&good, "{\"text\": \"aaa bbb aaa\", \"id\": 1}\n\n{\"text\": \"aaa ccc\"}\n")?;
    let counts = count_files(&[&good], Some("text"), &[])?;
    assert_eq!(counts.distinct(), 4, "aaa, ' bbb', ' aaa', ' ccc'");
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"text\": \"x\"}\n{\"body\": \"y\"}\n")?;
    let err = count_files(&[&bad], Some("text"), &[]).err().map(|e| format!("{e:#}")).unwrap_or_default();
    assert!(err.contains("bad.jsonl") && err.contains("line 2") && err.contains("--json-key"), "{err}");
    let err = count_files(&[dir.join("missing.txt")], None, &[]).err().map(|e| format!("{e:#}")).unwrap_or_default();
    assert!(err.contains("missing.txt") && err.contains("--input"), "{err}");
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[test]
fn tinyshakespeare_vocabulary_round_trips_and_compresses() -> anyhow::Result<()> {
    let Some(data) = data_dir("tinyshakespeare.txt") else { return Ok(()) };
    let input = data.join("tinyshakespeare.txt");
    let counts = count_files(&[&input], None, &[])?;
    let trained = train_byte_level_bpe(&counts, &options(1000))?;
    assert_eq!(trained.tokens.len(), 1000);
    let dir = scratch_dir("shakespeare")?;
    trained.write(&dir)?;
    let tok = Gpt2BpeTokenizer::from_files(&dir.join("vocab.json"), &dir.join("merges.txt"))?;
    let text = std::fs::read_to_string(&input)?;
    let sample = &text[..50_000];
    let ids = tok.encode(sample)?;
    assert_eq!(tok.decode(&ids)?, sample);
    // A 1000-token vocabulary fitted to this text: well under half a token per byte.
    assert!(ids.len() * 2 < sample.len(), "{} ids for {} bytes", ids.len(), sample.len());
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
