//! `--overlap-param-gather`'s forward pre-hook: the GPT model accepts it and calls it with each
//! module's parameters right before that module's forward, in forward order (embedding, each
//! layer, final norm, the untied output layer), once per forward.

mod common;

use common::*;
use megatron_core::{ForwardPreHook, Mode, Model, ParallelContext, Param, Result};
use megatron_gpt::GptModel;
use std::sync::{Arc, Mutex};

/// Records the parameter names of every call.
struct Recorder(Arc<Mutex<Vec<Vec<String>>>>);

impl ForwardPreHook for Recorder {
    fn before_forward(&mut self, params: &mut [&mut Param]) -> Result<()> {
        self.0.lock().unwrap().push(params.iter().map(|p| p.name.clone()).collect());
        Ok(())
    }
    fn finish(&mut self, _params: &mut [&mut Param]) -> Result<()> {
        Ok(())
    }
}

#[test]
fn gpt_calls_the_pre_hook_per_module_in_forward_order() {
    for untied in [false, true] {
        check_order(untied);
    }
}

fn check_order(untied: bool) {
    let mut config = tiny_config(64, 8);
    config.untie_embeddings_and_output_weights = untied;
    let mut model = GptModel::new(config.clone(), backend(), ParallelContext::single()).unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    assert!(model.set_forward_pre_hook(Arc::new(Mutex::new(Recorder(calls.clone())))));
    model.forward(&batch(2, config.seq_length, config.vocab_size, 3), Mode::Train).unwrap();
    let calls = calls.lock().unwrap().clone();
    let mut want = vec!["embedding.", "decoder.layers.0.", "decoder.layers.1.", "decoder.final_layernorm."];
    if untied {
        want.push("output_layer.");
    }
    assert_eq!(calls.len(), want.len(), "{calls:?}");
    for (call, prefix) in calls.iter().zip(want) {
        assert!(!call.is_empty() && call.iter().all(|n| n.starts_with(prefix)), "expected {prefix}*: {call:?}");
    }
    // Every parameter is announced exactly once per forward, before its module runs.
    let mut named: Vec<String> = calls.concat();
    named.sort();
    let mut all: Vec<String> = model.params().iter().map(|p| p.name.clone()).collect();
    all.sort();
    assert_eq!(named, all);
}
