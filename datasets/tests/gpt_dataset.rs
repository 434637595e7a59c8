//! The `gpt` and `mock` dataset plugins end to end through the registry, on small datasets
//! written with the builder into a temporary directory.

use megatron_core::registry::{DatasetEnv, Registry};
use megatron_core::{Dataset, Sample};
use megatron_datasets::gpt::{GptDataset, GptSplitConfig};
use megatron_datasets::{IndexedDataset, IndexedDatasetBuilder, TokenDType};
use serde_json::json;
use std::path::Path;
use std::sync::Arc;

/// Documents of the given lengths; token `p` of document `d` is `100*d + p`.
fn write_docs(prefix: &Path, sizes: &[usize]) -> anyhow::Result<()> {
    let mut w = IndexedDatasetBuilder::create(prefix, TokenDType::U16)?;
    for (d, &n) in sizes.iter().enumerate() {
        let doc: Vec<u32> = (0..n as u32).map(|p| 100 * d as u32 + p).collect();
        w.add_item(&doc)?;
        w.end_document();
    }
    w.finalize()
}

fn text(s: &Sample) -> Vec<i32> {
    let mut t = s.tokens.clone();
    t.extend(s.labels.last());
    t
}

#[test]
fn golden_samples_of_spec_2_7() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let prefix = dir.path().join("golden");
    write_docs(&prefix, &[5, 3, 7, 2, 6])?;
    let data = Arc::new(IndexedDataset::open(&prefix)?);
    let cfg = GptSplitConfig {
        split_name: "train".into(),
        sequences: 0..5,
        seq_length: 4,
        num_samples: Some(10),
        seed: 1234,
        drop_last_partial: true,
    };
    let ds = GptDataset::new(data, &cfg)?;
    assert_eq!(ds.len(), 11);
    let s0 = ds.get(0)?;
    assert_eq!(s0.tokens, [205, 206, 400, 401]);
    assert_eq!(s0.labels, [206, 400, 401, 402]);
    assert_eq!(s0.loss_mask, [1.0; 4]);
    assert_eq!(text(&ds.get(1)?), [4, 100, 101, 102, 300]);
    assert_eq!(text(&ds.get(2)?), [201, 202, 203, 204, 205]);
    assert!(ds.get(11).is_err());
    Ok(())
}

#[test]
fn windows_stitch_back_to_the_shuffled_documents() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let prefix = dir.path().join("stitch");
    let sizes = [9, 1, 14, 3, 0, 22, 5, 8, 2, 17, 6, 11];
    write_docs(&prefix, &sizes)?;
    let data = Arc::new(IndexedDataset::open(&prefix)?);
    let cfg = GptSplitConfig {
        split_name: "train".into(),
        sequences: 0..sizes.len(),
        seq_length: 8,
        num_samples: Some(40),
        seed: 99,
        drop_last_partial: true,
    };
    let ds = GptDataset::new(data.clone(), &cfg)?;
    assert!(ds.len() >= 40 && ds.indices().num_epochs > 1);
    // The token stream: documents in document-index order.
    let stream: Vec<i64> =
        ds.indices().document_index.iter().flat_map(|&d| data.sequence(d as usize).unwrap_or_default()).collect();
    // Window j covers stream[8j .. 8j+9]; consecutive windows overlap by one token.
    for j in 0..ds.len() {
        assert_eq!(ds.window(j)?, stream[8 * j..8 * j + 9], "window {j}");
    }
    // The served order is a permutation of the windows.
    let mut seen: Vec<u64> = ds.indices().shuffle_index.clone();
    seen.sort();
    assert_eq!(seen, (0..ds.len() as u64).collect::<Vec<_>>());
    for k in [0, 7, ds.len() - 1] {
        let want: Vec<i32> = ds.window(ds.indices().shuffle_index[k] as usize)?.iter().map(|&t| t as i32).collect();
        assert_eq!(text(&ds.get(k)?), want);
    }
    Ok(())
}

#[test]
fn plugin_splits_are_deterministic_and_seeded() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let prefix = dir.path().join("plugin");
    let sizes: Vec<usize> = (0..50).map(|d| 3 + (d * 7) % 13).collect();
    write_docs(&prefix, &sizes)?;
    let reg = Registry::builtin()?;
    let env = DatasetEnv::default();
    let config = |seed: u64, split: &str| {
        json!({ "data_path": [prefix.to_string_lossy()], "split": split, "seq_length": 6, "seed": seed,
                "num_samples": [30, 5, 0] })
    };
    let a = reg.dataset("gpt", config(1, "8,2,0"), &env)?;
    let b = reg.dataset("gpt", config(1, "8,2,0"), &env)?;
    let c = reg.dataset("gpt", config(2, "8,2,0"), &env)?;
    let (Some(ta), Some(tb), Some(tc)) = (&a.train, &b.train, &c.train) else { anyhow::bail!("no train split") };
    assert!(a.valid.is_some() && a.test.is_none(), "a zero-width split is absent");
    assert!(ta.len() >= 30);
    let all = |d: &Arc<dyn Dataset>| (0..d.len()).map(|i| d.get(i)).collect::<anyhow::Result<Vec<_>>>();
    assert_eq!(all(ta)?, all(tb)?);
    assert_ne!(all(ta)?, all(tc)?);
    // Train uses documents [0, 40), valid [40, 50): their tokens never mix.
    let max_doc = |d: &Arc<dyn Dataset>| all(d).map(|v| v.iter().flat_map(|s| s.tokens.clone()).max());
    assert!(max_doc(ta)?.unwrap_or(0) < 4000);
    let valid = a.valid.as_ref().map(all).transpose()?.unwrap_or_default();
    assert!(valid.iter().flat_map(|s| s.tokens.iter()).all(|&t| t >= 4000));

    // A blend of missing prefixes fails naming the first missing file.
    let blend =
        json!({ "data_path": ["0.3 /nonexistent/A 0.7 /nonexistent/B"], "seq_length": 6, "num_samples": [1, 1, 1] });
    let err = reg.dataset("gpt", blend, &env).err().map(|e| format!("{e:#}")).unwrap_or_default();
    assert!(err.contains("/nonexistent/A.idx"), "{err}");
    let unknown = json!({ "data_path": ["x"], "seq_length": 6, "num_samples": [1, 1, 1], "seq_len": 3 });
    let err = reg.dataset("gpt", unknown, &env).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("unknown field"), "{err}");
    Ok(())
}

#[test]
fn mock_plugin_through_the_registry() -> anyhow::Result<()> {
    let reg = Registry::builtin()?;
    let cfg = json!({ "seq_length": 8, "vocab_size": 100, "seed": 3, "num_samples": [4, 2, 2] });
    let a = reg.dataset("mock", cfg.clone(), &DatasetEnv::default())?;
    let b = reg.dataset("mock", cfg, &DatasetEnv::default())?;
    let (Some(ta), Some(tb)) = (a.train, b.train) else { anyhow::bail!("no train split") };
    assert_eq!(ta.get(3)?, tb.get(3)?);
    assert_eq!(ta.get(3)?.tokens.len(), 8);
    assert!(ta.get(4).is_err());
    Ok(())
}
