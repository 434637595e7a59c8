//! The tp2 x pp2 GPT checkpoint written by Megatron-LM's own code
//! (scripts/megatron_legacy_fixture.py) is read and reassembled.

use megatron_checkpoint_megatron::{legacy, Value};
use std::path::PathBuf;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/megatron_legacy_tp2pp2")
}

#[test]
fn reads_megatron_written_tp2_pp2_checkpoint() {
    let ck = legacy::open(&fixture(), None).unwrap();
    assert_eq!(ck.iteration(), 10);
    assert_eq!(
        (ck.shape.tp, ck.shape.pp, ck.shape.num_layers, ck.shape.groups, ck.shape.padded_vocab),
        (2, 2, 4, 2, 128)
    );
    assert_eq!(ck.args.get("hidden_size"), Some(&Value::Int(32)));
    assert_eq!(ck.checkpoint_version(), 3.0);
    let sched = ck.scheduler_state().expect("opt_param_scheduler").to_json();
    assert_eq!(sched["num_steps"], 20, "{sched}");
    let mut calls = 0;
    let t = ck.full_tensors(&mut |_, _| calls += 1).unwrap();
    assert_eq!(calls, 4);
    assert_eq!(t["embedding.word_embeddings.weight"].shape, vec![128, 32]);
    // (np + 2 ng) hn = (4 + 4) * 8 rows; SwiGLU fc1 = 2 * ffn rows.
    assert_eq!(t["decoder.layers.3.self_attention.linear_qkv.weight"].shape, vec![64, 32]);
    assert_eq!(t["decoder.layers.3.mlp.linear_fc1.weight"].shape, vec![96, 32]);
    assert_eq!(t["decoder.layers.2.mlp.linear_fc2.weight"].shape, vec![32, 48]);
    assert!(!t.contains_key("output_layer.weight"), "tied head is not a separate tensor");
    println!("{} tensors: {:?}", t.len(), t.keys().collect::<Vec<_>>());
}
