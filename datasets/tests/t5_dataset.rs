//! The T5 span-corruption dataset against Megatron-Core's own code: the fixture
//! (`scripts/t5_dataset_fixture.py`) ran megatron-core's compiled `build_mapping` and
//! `T5MaskedWordPieceDataset.__getitem__` on a sentence-split tiny-Shakespeare prefix; here
//! the same files give the same sample index (md5 of all rows, first 50 compared) and the
//! same first 1000 samples (100 compared field by field, all 1000 by md5). Needs
//! `../shared/data/bert-base-uncased/vocab.txt` for the word-continuation flags (skips
//! without it). Also the masked fraction and span lengths over the samples.

use megatron_datasets::indexed::IndexedDataset;
use megatron_datasets::md5::md5_hex;
use megatron_datasets::t5::{T5Dataset, T5DatasetConfig, T5Vocab};
use std::path::PathBuf;
use std::sync::Arc;

fn shared(name: &str) -> Option<PathBuf> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.ancestors().map(|a| a.join("shared").join("data").join(name)).find(|p| p.exists())
}

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/t5")
}

#[test]
fn samples_equal_megatron_core() {
    let Some(vocab_path) = shared("bert-base-uncased/vocab.txt") else {
        eprintln!("SKIP: ../shared/data/bert-base-uncased/vocab.txt not found");
        return;
    };
    let text = std::fs::read_to_string(&vocab_path).unwrap();
    let mut continuation: Vec<bool> = text.lines().map(|l| l.starts_with("##")).collect();
    assert_eq!(continuation.len(), 30522);
    continuation.extend(std::iter::repeat_n(false, 102)); // [BOS], [EOS], <extra_id_0..99>
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("expected.json")).unwrap()).unwrap();
    let sp = &exp["special"];
    let id = |k: &str| sp[k].as_i64().unwrap();
    let first = id("first_sentinel");
    let vocab = T5Vocab {
        continuation,
        cls: id("cls"),
        sep: id("sep"),
        mask: id("mask"),
        pad: id("pad"),
        bos: id("bos"),
        eos: id("eos"),
        sentinels: (first..first + id("sentinels")).collect(),
    };
    let data = Arc::new(IndexedDataset::open(fixture().join("t5_shakespeare")).unwrap());
    let n_docs = data.document_indices().len() - 1;
    let num = exp["num_samples"].as_u64().unwrap();
    let cfg = T5DatasetConfig::new(
        exp["encoder_seq_length"].as_u64().unwrap() as usize,
        exp["decoder_seq_length"].as_u64().unwrap() as usize,
        exp["seed"].as_i64().unwrap() as i32,
        num,
    );
    let ds = T5Dataset::new(data, 0..n_docs, Arc::new(vocab), cfg.clone()).unwrap();

    // Sample index.
    let idx = ds.sample_index();
    assert_eq!(idx.len() as u64, exp["index_len"].as_u64().unwrap());
    for (r, want) in exp["index_head"].as_array().unwrap().iter().enumerate() {
        let w: Vec<u64> = want.as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(idx[r].to_vec(), w, "sample index row {r}");
    }
    let bytes: Vec<u8> = idx.iter().flatten().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(md5_hex(&bytes), exp["index_md5"].as_str().unwrap());

    // Samples.
    let mut all = Vec::new();
    let (mut masked, mut real, mut spans, mut span_tokens) = (0usize, 0usize, 0usize, 0usize);
    for i in 0..num as usize {
        let s = ds.sample(i).unwrap();
        let fields = [&s.text_enc, &s.text_dec, &s.labels, &s.loss_mask, &s.enc_mask, &s.dec_mask];
        if let Some(want) = exp["samples"].as_array().unwrap().get(i) {
            for (name, got) in
                ["text_enc", "text_dec", "labels", "loss_mask", "enc_mask", "dec_mask"].iter().zip(fields)
            {
                let w: Vec<i64> = want[name].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
                assert_eq!(got, &w, "sample {i} field {name}");
            }
            assert_eq!(s.truncated as i64, want["truncated"].as_i64().unwrap(), "sample {i} truncated");
        }
        let mut one = Vec::new();
        for f in fields {
            one.extend(f.iter().flat_map(|v| v.to_le_bytes()));
        }
        one.extend((s.truncated as i64).to_le_bytes());
        let want = exp["sample_md5_prefixes"][i].as_str().unwrap();
        assert_eq!(&md5_hex(&one)[..8], want, "md5 of sample {i}: {s:?}");
        all.extend(one);
        // Statistics: masked tokens = decoder input minus bos and sentinels.
        let sentinels = s.text_dec.iter().filter(|&&t| t >= first).count();
        let dec_len: usize = s.loss_mask.iter().map(|&m| m as usize).sum();
        masked += dec_len - 1 - sentinels;
        real += s.enc_mask.iter().map(|&m| m as usize).sum::<usize>() - sentinels + dec_len - 1 - sentinels;
        spans += sentinels;
        span_tokens += dec_len - 1 - sentinels;
    }
    assert_eq!(md5_hex(&all), exp["samples_md5"].as_str().unwrap(), "md5 of the first {num} samples");
    let frac = masked as f64 / real as f64;
    let mean_span = span_tokens as f64 / spans as f64;
    println!("{num} samples: masked fraction {frac:.4} (configured 0.15), mean span {mean_span:.3} tokens");
    assert!((0.10..=0.16).contains(&frac), "masked fraction {frac}");
}
