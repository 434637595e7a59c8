//! Unit tests of [`super`]: merge and split are inverse for every kind at tp 1/2/4, SwiGLU
//! halves, stage offsets.

use super::*;
use crate::value::TorchDType;

fn tensor(shape: &[usize]) -> TensorData {
    let n: usize = shape.iter().product();
    let bytes = (0..n).flat_map(|i| (i as f32 * 0.5 - 3.0).to_le_bytes()).collect();
    TensorData { dtype: TorchDType::F32, shape: shape.to_vec(), bytes }
}

fn shape(tp: usize) -> Shape {
    Shape {
        tp,
        pp: 1,
        vp: 1,
        num_layers: 2,
        hidden: 8,
        heads: 4,
        groups: 4,
        head_dim: 2,
        ffn: 8,
        swiglu: true,
        padded_vocab: 16,
        untied: false,
        learned_positions: true,
        first_stage_layers: None,
        last_stage_layers: None,
    }
}

/// `merge` inverts `split` for every partition kind and tp size.
#[test]
fn merge_inverts_split() {
    let cases = [
        ("embedding.word_embeddings.weight", vec![16, 8]),
        ("decoder.layers.1.self_attention.linear_qkv.weight", vec![24, 8]),
        ("decoder.layers.1.self_attention.linear_qkv.bias", vec![24]),
        ("decoder.layers.0.mlp.linear_fc1.weight", vec![16, 8]),
        ("decoder.layers.0.mlp.linear_fc1.bias", vec![16]),
        ("decoder.layers.0.mlp.linear_fc2.weight", vec![8, 8]),
        ("decoder.layers.0.self_attention.linear_proj.weight", vec![8, 8]),
        ("decoder.layers.0.input_layernorm.weight", vec![8]),
    ];
    for tp in [1, 2, 4] {
        for (name, dims) in &cases {
            let full = tensor(dims);
            let shards: Vec<TensorData> = (0..tp).map(|r| split(name, &full, true, r, tp).unwrap()).collect();
            assert_eq!(merge(name, shards, &shape(tp)).unwrap(), full, "{name} at tp {tp}");
        }
    }
}

/// SwiGLU: rank r holds [gate rows of r; up rows of r].
#[test]
fn swiglu_shards_hold_both_halves() {
    let full = tensor(&[8]); // gate 0..4, up 4..8
    let r1 = split("decoder.layers.0.mlp.linear_fc1.bias", &full, true, 1, 2).unwrap();
    let vals: Vec<f32> = r1.to_f32();
    assert_eq!(vals, vec![-2.0, -1.5, 0.0, 0.5]); // elements 2,3 and 6,7
}

#[test]
fn stage_layers_follow_megatron_offsets() {
    let mut s = shape(1);
    (s.num_layers, s.pp, s.vp) = (8, 2, 2);
    // Interleaved: chunk 0 = layers 0-1 (pp0), 2-3 (pp1); chunk 1 = 4-5 (pp0), 6-7 (pp1).
    assert_eq!(s.stage_layers(1, 0).unwrap(), (2, 2));
    assert_eq!(s.stage_layers(0, 1).unwrap(), (4, 2));
    (s.vp, s.first_stage_layers) = (1, Some(2));
    s.pp = 3;
    assert_eq!(s.stage_layers(2, 0).unwrap(), (5, 3));
}
