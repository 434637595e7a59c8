//! Hugging Face export → import of a tiny random post-LN BERT gives back every parameter
//! bit-identically (with and without the binary head: `BertForPreTraining` /
//! `BertForMaskedLM`), and the exported names and shapes are transformers' (q/k/v split,
//! vocabulary padding removed). transformers' own logits on the exported model are checked by
//! `scripts/bert_hf_export_check.py`.

use megatron_bert::hf::{export_hf_bert, hf_bert_config, load_hf_bert_padded};
use megatron_bert::{BertConfig, BertModel, LayerNormPlacement};
use megatron_core::{Backend, ParallelContext};
use megatron_cpu::CpuBackend;
use safetensors::{serialize, Dtype};
use std::sync::Arc;

fn write_hf(model: &BertModel, dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    let tensors = export_hf_bert(model).unwrap();
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, d)| (n.clone(), s.clone(), d.iter().flat_map(|v| v.to_le_bytes()).collect()))
        .collect();
    let views: Vec<_> = bytes
        .iter()
        .map(|(n, s, b)| (n.clone(), safetensors::tensor::TensorView::new(Dtype::F32, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(dir.join("model.safetensors"), serialize(views, &None).unwrap()).unwrap();
    std::fs::write(dir.join("config.json"), hf_bert_config(model).to_string()).unwrap();
}

fn roundtrip(binary: bool) {
    let bk: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let cfg = BertConfig {
        num_layers: 2,
        hidden_size: 16,
        num_attention_heads: 4,
        ffn_hidden_size: Some(24),
        max_position_embeddings: 20,
        vocab_size: 50,
        make_vocab_size_divisible_by: 32,
        bert_binary_head: binary,
        layernorm: LayerNormPlacement::Post,
        gelu_erf: true,
        init_method_std: 0.3,
        seed: 11,
        ..Default::default()
    };
    let model = BertModel::new(cfg, bk.clone(), ParallelContext::single()).unwrap();
    let dir = std::env::temp_dir().join(format!("bert_hf_roundtrip_{}_{binary}", std::process::id()));
    write_hf(&model, &dir);
    let names: Vec<String> = export_hf_bert(&model).unwrap().into_iter().map(|t| t.0).collect();
    assert!(names.contains(&"bert.encoder.layer.1.attention.self.value.weight".to_string()));
    assert!(names.contains(&"cls.predictions.bias".to_string()));
    assert_eq!(names.contains(&"cls.seq_relationship.weight".to_string()), binary);
    assert_eq!(names.contains(&"bert.pooler.dense.weight".to_string()), binary);
    let word = export_hf_bert(&model).unwrap().into_iter().find(|t| t.0 == "bert.embeddings.word_embeddings.weight");
    assert_eq!(word.unwrap().1, vec![50, 16], "vocabulary padding is cut off");

    let back = load_hf_bert_padded(&dir, bk.clone(), 32).unwrap();
    assert!(back.fresh.is_empty(), "fresh after import: {:?}", back.fresh);
    assert!(back.unused.is_empty(), "unused after import: {:?}", back.unused);
    let (a, b) = (model.params(), back.model.params());
    assert_eq!(a.len(), b.len());
    for (p, q) in a.iter().zip(&b) {
        assert_eq!(p.name, q.name);
        let (mut x, mut y) = (bk.to_host(&p.value).unwrap().to_f32_vec(), bk.to_host(&q.value).unwrap().to_f32_vec());
        // Rows past the vocabulary are padding: not exported, zero after an import.
        let real = match p.name.as_str() {
            "embedding.word_embeddings.weight" => 50 * 16,
            "output_layer.bias" => 50,
            _ => x.len(),
        };
        assert!(y[real..].iter().all(|&v| v == 0.0));
        x.truncate(real);
        y.truncate(real);
        assert!(x.iter().zip(&y).all(|(u, v)| u.to_bits() == v.to_bits()), "`{}` changed in the round trip", p.name);
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn export_import_roundtrip_is_bit_identical() {
    roundtrip(true);
    roundtrip(false);
}

#[test]
fn pre_ln_models_are_refused() {
    let bk: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let cfg = BertConfig { hidden_size: 16, num_attention_heads: 2, vocab_size: 40, ..Default::default() };
    let model = BertModel::new(cfg, bk, ParallelContext::single()).unwrap();
    let e = export_hf_bert(&model).err().unwrap().to_string();
    assert!(e.contains("post-LN") && e.contains("--bert-post-ln"), "{e}");
}
