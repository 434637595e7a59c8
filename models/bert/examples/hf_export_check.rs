//! Writes a tiny random post-LN `BertForPreTraining` exported by `export_hf_bert` into DIR
//! (config.json, model.safetensors) together with our own MLM and sentence-order logits for a
//! padded batch of 3 rows (`ours.safetensors`), for `scripts/bert_hf_export_check.py` to load
//! in transformers and compare. `cargo run -p megatron-bert --example hf_export_check -- DIR`.

use anyhow::{Context, Result};
use megatron_bert::hf::{export_hf_bert, hf_bert_config};
use megatron_bert::{BertBatch, BertConfig, BertModel, LayerNormPlacement};
use megatron_core::{Backend, Mode, ParallelContext};
use megatron_cpu::CpuBackend;
use safetensors::{serialize, Dtype};
use std::sync::Arc;

fn main() -> Result<()> {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).context("usage: hf_export_check DIR")?);
    std::fs::create_dir_all(&dir)?;
    let bk: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let cfg = BertConfig {
        num_layers: 2,
        hidden_size: 32,
        num_attention_heads: 4,
        ffn_hidden_size: Some(48),
        max_position_embeddings: 24,
        vocab_size: 100,
        make_vocab_size_divisible_by: 64,
        layernorm: LayerNormPlacement::Post,
        gelu_erf: true,
        layernorm_epsilon: 1e-12,
        hidden_dropout: 0.0,
        attention_dropout: 0.0,
        init_method_std: 0.2,
        seed: 3,
        ..Default::default()
    };
    let (v, b, s) = (cfg.vocab_size, 3usize, 12usize);
    let mut model = BertModel::new(cfg, bk.clone(), ParallelContext::single())?;
    let lengths = vec![12usize, 7, 4];
    let mut tokens = vec![0i32; b * s];
    let mut types = vec![0i32; b * s];
    for r in 0..b {
        for t in 0..lengths[r] {
            tokens[r * s + t] = ((r * 31 + t * 17 + 5) % v) as i32;
            types[r * s + t] = i32::from(t >= lengths[r] / 2);
        }
    }
    let x = BertBatch {
        batch: b,
        seq: s,
        tokens: tokens.clone(),
        types: types.clone(),
        lengths: lengths.clone(),
        labels: vec![0; b * s],
        loss_mask: vec![0.0; b * s],
        is_random: vec![0; b],
        seed: 0,
    };
    model.forward_bert(&x, Mode::Eval)?;
    let logits = bk.to_host(model.logits_tensor())?.to_f32_vec();
    let padded = logits.len() / (b * s);
    let mlm: Vec<f32> = (0..b * s).flat_map(|i| logits[i * padded..i * padded + v].to_vec()).collect();
    let hidden = bk.to_host(model.hidden_states())?.to_f32_vec();
    let sop = model.binary_head.as_mut().context("binary head")?.forward(bk.as_ref(), &hidden, b, s)?;
    let tensors = export_hf_bert(&model)?;
    let f32s = |d: &[f32]| d.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let i32s = |d: &[i32]| d.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let write = |path: std::path::PathBuf, items: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>| -> Result<()> {
        let views: Vec<_> = items
            .iter()
            .map(|(n, d, sh, by)| Ok((n.clone(), safetensors::tensor::TensorView::new(*d, sh.clone(), by)?)))
            .collect::<Result<_>>()?;
        std::fs::write(path, serialize(views, &None)?)?;
        Ok(())
    };
    write(
        dir.join("model.safetensors"),
        tensors.iter().map(|(n, sh, d)| (n.clone(), Dtype::F32, sh.clone(), f32s(d))).collect(),
    )?;
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&hf_bert_config(&model))?)?;
    let lens: Vec<i32> = lengths.iter().map(|&l| l as i32).collect();
    write(
        dir.join("ours.safetensors"),
        vec![
            ("input_ids".into(), Dtype::I32, vec![b, s], i32s(&tokens)),
            ("token_type_ids".into(), Dtype::I32, vec![b, s], i32s(&types)),
            ("lengths".into(), Dtype::I32, vec![b], i32s(&lens)),
            ("prediction_logits".into(), Dtype::F32, vec![b, s, v], f32s(&mlm)),
            ("seq_relationship_logits".into(), Dtype::F32, vec![b, 2], f32s(&sop)),
        ],
    )?;
    println!("wrote {} ({} tensors) and our logits", dir.display(), tensors.len());
    Ok(())
}
