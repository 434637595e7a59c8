//! The indexed reader/writer against Megatron's own output: `tinyshakespeare_gpt2_text_document`
//! (written by megatron-core's `IndexedDatasetBuilder`). Opens it, rewrites it byte for byte,
//! and checks that truncated and forged copies fail with errors naming the file. Skips (with a
//! message) when `shared/data` is absent.

use megatron_datasets::indexed::{bin_path, idx_path};
use megatron_datasets::{IndexedDataset, IndexedDatasetBuilder, TokenDType};
use std::path::{Path, PathBuf};

fn shakespeare_prefix() -> Option<PathBuf> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let prefix = manifest
        .ancestors()
        .map(|a| a.join("shared/data/tinyshakespeare_gpt2_text_document"))
        .find(|p| idx_path(p).is_file() && bin_path(p).is_file());
    if prefix.is_none() {
        eprintln!(
            "SKIP: shared/data/tinyshakespeare_gpt2_text_document.{{bin,idx}} not found above {}",
            manifest.display()
        );
    }
    prefix
}

#[test]
fn opens_megatrons_file_and_rewrites_it_byte_for_byte() -> anyhow::Result<()> {
    let Some(prefix) = shakespeare_prefix() else { return Ok(()) };
    let ds = IndexedDataset::open(&prefix)?;
    assert_eq!(ds.dtype(), TokenDType::U16);
    assert_eq!(ds.num_documents(), 7222);
    assert_eq!(ds.len(), 7222, "one sequence per document");
    assert_eq!(ds.num_tokens(), 330_804);
    // Every document ends with GPT-2's eod (preprocessed with --append-eod) and starts with
    // "First Citizen:" = [5962, 22307, 25].
    let first = ds.sequence(0)?;
    assert_eq!(first[..3], [5962, 22307, 25]);
    assert!((0..ds.len()).step_by(97).all(|i| ds.sequence(i).ok().and_then(|s| s.last().copied()) == Some(50256)));

    let dir = tempfile::tempdir()?;
    let copy = dir.path().join("copy");
    let mut w = IndexedDatasetBuilder::create(&copy, ds.dtype())?;
    let docs = ds.document_indices();
    for d in 0..ds.num_documents() {
        for i in docs[d]..docs[d + 1] {
            w.add_item(&ds.sequence(i as usize)?)?;
        }
        w.end_document();
    }
    w.finalize()?;
    assert!(std::fs::read(bin_path(&copy))? == std::fs::read(bin_path(&prefix))?, ".bin differs");
    assert!(std::fs::read(idx_path(&copy))? == std::fs::read(idx_path(&prefix))?, ".idx differs");
    Ok(())
}

/// Copies the dataset into `dir` under `name`, applies `forge` to the (idx, bin) bytes, and
/// returns the error message of opening it.
fn open_forged(dir: &Path, src: &Path, name: &str, forge: impl FnOnce(&mut Vec<u8>, &mut Vec<u8>)) -> String {
    let prefix = dir.join(name);
    let (mut idx, mut bin) = match (std::fs::read(idx_path(src)), std::fs::read(bin_path(src))) {
        (Ok(i), Ok(b)) => (i, b),
        _ => return "cannot read the source dataset".into(),
    };
    forge(&mut idx, &mut bin);
    if std::fs::write(idx_path(&prefix), idx).is_err() || std::fs::write(bin_path(&prefix), bin).is_err() {
        return "cannot write the forged copy".into();
    }
    match IndexedDataset::open(&prefix) {
        Ok(_) => "opened without error".into(),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn truncated_and_forged_copies_are_rejected_with_clear_errors() -> anyhow::Result<()> {
    let Some(src) = shakespeare_prefix() else { return Ok(()) };
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let idx_len = std::fs::metadata(idx_path(&src))?.len();
    let bin_len = std::fs::metadata(bin_path(&src))?.len();
    let cases: Vec<(&str, String, Vec<String>)> = vec![
        (
            "idx_truncated",
            open_forged(d, &src, "idx_truncated", |i, _| i.truncate(i.len() - 8)),
            vec!["truncated".into(), idx_len.to_string(), (idx_len - 8).to_string(), "idx_truncated.idx".into()],
        ),
        ("header_only", open_forged(d, &src, "header_only", |i, _| i.truncate(20)), vec!["header".into()]),
        ("bad_magic", open_forged(d, &src, "bad_magic", |i, _| i[0] = b'X'), vec!["not a Megatron .idx file".into()]),
        ("version", open_forged(d, &src, "version", |i, _| i[9] = 2), vec!["version 2".into()]),
        ("dtype", open_forged(d, &src, "dtype", |i, _| i[17] = 9), vec!["dtype code 9".into()]),
        (
            "forged_count",
            open_forged(d, &src, "forged_count", |i, _| i[18] = i[18].wrapping_add(1)),
            vec!["implies".into(), idx_len.to_string()],
        ),
        (
            "pointer",
            open_forged(d, &src, "pointer", |i, _| i[34 + 4 * 7222 + 8] ^= 1),
            vec!["sequence 1 points at byte".into()],
        ),
        (
            "doc_index",
            open_forged(d, &src, "doc_index", |i, _| {
                let n = i.len();
                i[n - 16] = 0xff; // the second-to-last boundary jumps past the last one
            }),
            vec!["document indices".into()],
        ),
        (
            "bin_truncated",
            open_forged(d, &src, "bin_truncated", |_, b| b.truncate(b.len() - 2)),
            vec!["bin_truncated.bin".into(), (bin_len - 2).to_string(), bin_len.to_string()],
        ),
    ];
    for (name, err, wants) in cases {
        assert!(err.contains(&format!("{name}.")), "{name}: error does not name the file: {err}");
        assert!(err.contains("preprocess"), "{name}: error does not say how to fix it: {err}");
        for want in wants {
            assert!(err.contains(&want), "{name}: expected {want:?} in: {err}");
        }
    }
    let missing = IndexedDataset::open(d.join("missing")).err().map(|e| format!("{e:#}")).unwrap_or_default();
    assert!(missing.contains("missing.idx") && missing.contains("--data-path"), "{missing}");
    Ok(())
}
