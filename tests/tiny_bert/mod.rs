//! A tiny random post-LN BERT (2 layers, hidden 16, 4 heads, vocab 216) written as a Hugging
//! Face directory (`model.safetensors`, `config.json`, the BERT fixture's `vocab.txt`) by our
//! own exporter: the input of the BERT import and finetune tests.

use megatron_bert::hf::{export_hf_bert, hf_bert_config};
use megatron_bert::{BertConfig, BertModel, LayerNormPlacement};
use megatron_core::{Backend, ParallelContext};
use safetensors::{serialize, Dtype};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Writes the model drawn with `seed` into `dir` (created if needed).
pub fn write_tiny_hf_bert(dir: &Path, seed: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let bk: Arc<dyn Backend> = Arc::new(megatron_cpu::CpuBackend::new());
    let cfg = BertConfig {
        num_layers: 2,
        hidden_size: 16,
        num_attention_heads: 4,
        ffn_hidden_size: Some(32),
        max_position_embeddings: 24,
        vocab_size: 216,
        layernorm: LayerNormPlacement::Post,
        gelu_erf: true,
        init_method_std: 0.2,
        seed,
        ..Default::default()
    };
    let model = BertModel::new(cfg, bk, ParallelContext::single()).unwrap();
    let tensors = export_hf_bert(&model).unwrap();
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, d)| (n.clone(), s.clone(), d.iter().flat_map(|v| v.to_le_bytes()).collect()))
        .collect();
    let views: Vec<_> = bytes
        .iter()
        .map(|(n, s, b)| (n.clone(), safetensors::tensor::TensorView::new(Dtype::F32, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(dir.join("model.safetensors"), serialize(views, &None).unwrap()).unwrap();
    std::fs::write(dir.join("config.json"), hf_bert_config(&model).to_string()).unwrap();
    let vocab = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("datasets/tests/fixtures/bert/vocab.txt");
    std::fs::copy(vocab, dir.join("vocab.txt")).unwrap();
}
