//! A tiny random transformers `Mamba2ForCausalLM` (made on the first run, kept in
//! CARGO_TARGET_TMPDIR, by
//! `scripts/hf_mamba2_fixture.py` with /work/venv/bin/python or $MEGATRON_PYTHON; skipped with
//! a message when that Python is absent): imported, the logits equal those of its slow
//! pure-PyTorch path within 1e-4 relative, greedy recurrent generation gives its tokens, and
//! the export gives back the same tensors bit for bit.

use megatron_core::{Backend, Model, ParallelContext};
use megatron_cpu::CpuBackend;
use megatron_hybrid::hf::{config_from_hf_mamba2, export_hf_mamba2, load_hf_mamba2};
use megatron_hybrid::HybridModel;
use safetensors::SafeTensors;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn python() -> Option<PathBuf> {
    let p = PathBuf::from(std::env::var("MEGATRON_PYTHON").unwrap_or_else(|_| "/work/venv/bin/python".into()));
    p.exists().then_some(p)
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

#[test]
fn hf_mamba2_logits_generation_and_export() {
    let Some(py) = python() else {
        eprintln!("SKIP: no Python with transformers (/work/venv/bin/python or $MEGATRON_PYTHON)");
        return;
    };
    // Made once per target dir (importing torch takes most of this test's time); the script
    // writes reference.json last, so its presence means a complete fixture.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hf_mamba2_fixture");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/hf_mamba2_fixture.py");
    if !dir.join("reference.json").exists() {
        let st = std::process::Command::new(py).arg(&script).arg(&dir).output().unwrap();
        if !st.status.success() {
            eprintln!(
                "SKIP: the fixture script failed (transformers missing?): {}",
                String::from_utf8_lossy(&st.stderr)
            );
            return;
        }
    }
    let hf_cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let reference: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let tokens: Vec<Vec<i32>> = serde_json::from_value(reference["tokens"].clone()).unwrap();
    let (batch, seq) = (tokens.len(), tokens[0].len());
    let config = config_from_hf_mamba2(&hf_cfg, seq).unwrap();
    let be: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut model = HybridModel::new(config, "mamba", be.clone(), ParallelContext::single()).unwrap();
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    load_hf_mamba2(&mut model, &mut |name| {
        let t = st.tensor(name)?;
        Ok((t.shape().to_vec(), f32s(t.data())))
    })
    .unwrap();
    // Logits.
    let flat: Vec<i32> = tokens.concat();
    let ours = be.to_host(&model.logits(&flat, batch, seq).unwrap()).unwrap().to_f32_vec();
    let want: Vec<f32> = serde_json::from_value(reference["logits"].clone()).unwrap();
    assert_eq!(ours.len(), want.len());
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let worst = ours.iter().zip(&want).fold(0.0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
    println!("max |logit difference| / max |logit| = {worst:e}");
    assert!(worst < 1e-4, "logits differ from transformers: {worst}");
    // Greedy recurrent generation.
    let prompt = reference["prompt_len"].as_u64().unwrap() as usize;
    let expected: Vec<Vec<i32>> = serde_json::from_value(reference["generated"].clone()).unwrap();
    let v = model.padded_vocab_size();
    let mut cache = model.new_cache(batch, 64).unwrap();
    let mut logits = Vec::new();
    for t in 0..prompt {
        logits = model.decode_step(&tokens.iter().map(|r| r[t]).collect::<Vec<_>>(), &mut cache).unwrap();
    }
    let mut got = vec![Vec::new(); batch];
    for _ in 0..expected[0].len() {
        let next: Vec<i32> = (0..batch)
            .map(|b| {
                let row = &logits[b * v..(b + 1) * v];
                (0..v).max_by(|&i, &j| row[i].total_cmp(&row[j]).then(j.cmp(&i))).unwrap() as i32
            })
            .collect();
        for (g, &n) in got.iter_mut().zip(&next) {
            g.push(n);
        }
        logits = model.decode_step(&next, &mut cache).unwrap();
    }
    assert_eq!(got, expected, "greedy generation differs from transformers");
    // Export: the same tensors back, bit for bit.
    for (name, (shape, data)) in export_hf_mamba2(&model).unwrap() {
        let t = st.tensor(&name).unwrap();
        assert_eq!(t.shape(), &shape[..], "{name}");
        assert!(f32s(t.data()).iter().zip(&data).all(|(a, b)| a.to_bits() == b.to_bits()), "{name} differs");
    }
}
