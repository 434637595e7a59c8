//! `megatron_datasets::bert` against Megatron-LM's own code: the fixture in `fixtures/bert/`
//! (a synthetic vocabulary with `##` pieces, a sentence-split `.bin/.idx` written by
//! megatron-core's `IndexedDatasetBuilder`, and `oracle.json`) was made by
//! `scripts/bert_dataset_oracle.py make-fixture`, which runs megatron-core 0.16.1's compiled
//! `helpers_cpp.build_mapping` and `BERTMaskedWordPieceDataset.__getitem__` unmodified. For two
//! configurations (binary head at seq 64 / seed 1234 / 300 samples, no binary head at seq 48 /
//! seed 7 / 200 samples; documents 0..110 of 120, one with a > 512-token sentence) the
//! sample index must be equal row for row and every sample (text, types, labels,
//! padding_mask, loss_mask, is_random, truncated) equal: the md5 of its canonical string for
//! all, the arrays themselves for the first three.

use megatron_datasets::bert::{masking_vocab_from_file, BertDatasetConfig, BertMaskedDataset, BertSample};
use megatron_datasets::md5::md5_hex;
use megatron_datasets::IndexedDataset;
use serde_json::Value;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bert").join(name)
}

fn canonical(s: &BertSample) -> String {
    let join = |v: &[i64]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
    let parts = [&s.text, &s.types, &s.labels, &s.padding_mask, &s.loss_mask].map(|v| join(v));
    format!("{}|{}|{}", parts.join("|"), s.is_random, s.truncated)
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array().expect("array").iter().map(|x| x.as_i64().expect("int")).collect()
}

#[test]
fn samples_equal_megatron_lm() -> anyhow::Result<()> {
    let oracle: Value = serde_json::from_str(&std::fs::read_to_string(fixture("oracle.json"))?)?;
    let vocab = masking_vocab_from_file(&fixture("vocab.txt"))?;
    for case in oracle["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().unwrap_or("?");
        let docs = ints(&case["docs"]);
        let config = BertDatasetConfig {
            sequence_length: case["seq_length"].as_u64().expect("seq") as usize,
            seed: case["seed"].as_u64().expect("seed") as u32,
            masking_probability: case["mask_prob"].as_f64().expect("mask_prob"),
            short_sequence_probability: case["short_seq_prob"].as_f64().expect("short"),
            classification_head: case["binary_head"].as_bool().expect("binary"),
            num_samples: case["num_samples"].as_u64(),
            pad_id: 0,
        };
        let data = IndexedDataset::open(fixture("synthetic_sentences"))?;
        let ds = BertMaskedDataset::new(data, docs[0] as usize..docs[1] as usize, vocab.clone(), config)?;
        let want_index: Vec<Vec<i64>> = case["sample_index"].as_array().expect("index").iter().map(ints).collect();
        let got_index: Vec<Vec<i64>> =
            ds.sample_index().iter().map(|r| r.iter().map(|&v| v as i64).collect()).collect();
        assert_eq!(got_index, want_index, "{name}: sample index");
        let md5s = case["md5"].as_array().expect("md5");
        assert_eq!(md5s.len(), ds.len(), "{name}: sample count");
        for (i, want) in md5s.iter().enumerate() {
            let s = ds.get(i)?;
            if let Some(full) = case["first"].as_array().and_then(|f| f.get(i)) {
                assert_eq!(s.text, ints(&full["text"]), "{name} sample {i}: text");
                assert_eq!(s.types, ints(&full["types"]), "{name} sample {i}: types");
                assert_eq!(s.labels, ints(&full["labels"]), "{name} sample {i}: labels");
                assert_eq!(s.padding_mask, ints(&full["padding_mask"]), "{name} sample {i}: padding_mask");
                assert_eq!(s.loss_mask, ints(&full["loss_mask"]), "{name} sample {i}: loss_mask");
                assert_eq!(s.is_random, full["is_random"].as_i64().unwrap_or(-9), "{name} sample {i}: is_random");
                assert_eq!(s.truncated, full["truncated"].as_i64().unwrap_or(-9), "{name} sample {i}: truncated");
            }
            assert_eq!(md5_hex(canonical(&s).as_bytes()), want.as_str().unwrap_or(""), "{name} sample {i}: {s:?}");
        }
    }
    Ok(())
}

#[test]
fn too_few_sentences_is_a_clear_error() -> anyhow::Result<()> {
    let data = IndexedDataset::open(fixture("synthetic_sentences"))?;
    let vocab = masking_vocab_from_file(&fixture("vocab.txt"))?;
    let config = BertDatasetConfig {
        sequence_length: 64,
        seed: 1,
        masking_probability: 0.15,
        short_sequence_probability: 0.1,
        classification_head: true,
        num_samples: Some(10),
        pad_id: 0,
    };
    // Document 17 holds a > 512-token sentence: skipped, so no sample can be built.
    let e = BertMaskedDataset::new(data, 17..18, vocab, config).err().expect("refused").to_string();
    assert!(e.contains("sample index"), "{e}");
    Ok(())
}
