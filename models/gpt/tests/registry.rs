//! The `gpt` model plugin is registered and builds from a JSON config; config errors name the
//! field.

mod common;

use common::*;
use megatron_core::registry::ModelEnv;
use megatron_core::{ParallelContext, PluginKind, Registry};

#[test]
fn gpt_plugin_builds_from_json_and_rejects_unknown_fields() {
    // Referencing the crate keeps its inventory record linked.
    let _ = megatron_gpt::GptConfig::new(1, 8, 2, 4, 16);
    let reg = Registry::builtin().unwrap();
    assert!(reg.names(PluginKind::Model).contains(&"gpt"));
    let env = ModelEnv { backend: backend(), ctx: ParallelContext::single(), mlp: None };
    let cfg = serde_json::json!({"num_layers": 1, "hidden_size": 8, "num_attention_heads": 2, "seq_length": 4,
        "max_position_embeddings": 4, "vocab_size": 50});
    let model = reg.model("gpt", cfg, &env).unwrap();
    assert_eq!(model.name(), "gpt");
    let words = model.params().iter().find(|p| p.name == "embedding.word_embeddings.weight").map(|p| p.layout.clone());
    assert_eq!(words.unwrap().global_shape, vec![128, 8], "vocab 50 padded to a multiple of 128");
    let names: Vec<&str> = model.params().iter().map(|p| p.name.as_str()).collect();
    for n in [
        "embedding.position_embeddings.weight",
        "decoder.layers.0.input_layernorm.weight",
        "decoder.layers.0.self_attention.linear_qkv.bias",
        "decoder.layers.0.self_attention.linear_proj.weight",
        "decoder.layers.0.pre_mlp_layernorm.bias",
        "decoder.layers.0.mlp.linear_fc1.weight",
        "decoder.layers.0.mlp.linear_fc2.bias",
        "decoder.final_layernorm.weight",
    ] {
        assert!(names.contains(&n), "missing {n} in {names:?}");
    }
    assert!(!names.contains(&"output_layer.weight"), "tied by default");

    let bad = serde_json::json!({"num_layers": 1, "hidden_size": 8, "num_attention_heads": 2, "seq_length": 4,
        "max_position_embeddings": 4, "vocab_size": 50, "num_layer": 3});
    let err = reg.model("gpt", bad, &env).err().unwrap().to_string();
    assert!(err.contains("num_layer") && err.contains("gpt"), "{err}");
    let short = serde_json::json!({"num_layers": 1, "hidden_size": 8, "num_attention_heads": 2, "seq_length": 8,
        "max_position_embeddings": 4, "vocab_size": 50});
    let err = format!("{:#}", reg.model("gpt", short, &env).err().unwrap());
    assert!(err.contains("max_position_embeddings"), "{err}");
}
