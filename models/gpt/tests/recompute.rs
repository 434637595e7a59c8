//! Full activation recomputation (`--recompute-granularity full`): the recomputed forward uses
//! the same dropout masks, so losses and gradients are bit-identical to keeping every
//! activation, for both methods, short last units, eval forwards in between and microbatches
//! in flight (the pipeline stash); and the memory held after a forward falls by exactly the
//! dropped layers' activation sets and inner residuals.

mod common;

use common::*;
use megatron_core::{Batch, Mode, Model, ParallelContext, StageOutput};
use megatron_gpt::{GptConfig, GptModel};
use megatron_transformer::{FullRecompute, RecomputeMethod};

const LAYERS: usize = 4;

fn config(recompute: Option<(RecomputeMethod, usize)>) -> GptConfig {
    let mut c = tiny_config(64, 8);
    c.num_layers = LAYERS;
    c.hidden_dropout = 0.1;
    c.attention_dropout = 0.1;
    c.recompute = recompute.map(|(method, num_layers)| FullRecompute { method, num_layers });
    c
}

fn batches(c: &GptConfig, m: usize) -> Vec<Batch> {
    (0..m).map(|i| batch(2, c.seq_length, c.vocab_size, 500 + i as u64)).collect()
}

fn grads(model: &GptModel) -> Vec<(String, Vec<f32>)> {
    let bk = model.backend();
    model.params().iter().map(|p| (p.name.clone(), bk.to_host(&p.grad).unwrap().to_f32_vec())).collect()
}

fn loss_of(out: StageOutput) -> f64 {
    match out {
        StageOutput::Loss(r) => r.loss_sum,
        StageOutput::Hidden(_) => panic!("a single-stage model returns the loss"),
    }
}

const CHOICES: [Option<(RecomputeMethod, usize)>; 5] = [
    None,
    Some((RecomputeMethod::Uniform, 1)),
    Some((RecomputeMethod::Uniform, 2)),
    Some((RecomputeMethod::Uniform, 3)), // units 0..3 and 3..4
    Some((RecomputeMethod::Block, 2)),
];

/// Two iterations of 3 microbatches (forward and backward back to back), an eval forward
/// between them: losses (train and eval) and the gradients.
fn back_to_back(recompute: Option<(RecomputeMethod, usize)>) -> Run {
    let c = config(recompute);
    let bs = batches(&c, 3);
    let mut model = GptModel::new(c, backend(), ParallelContext::single()).unwrap();
    let mut losses = Vec::new();
    for _ in 0..2 {
        model.zero_grad().unwrap();
        for b in &bs {
            losses.push(model.forward(b, Mode::Train).unwrap().loss_sum);
            model.backward(1.0 / 3.0).unwrap();
        }
        losses.push(model.forward(&bs[0], Mode::Eval).unwrap().loss_sum);
    }
    (losses, grads(&model))
}

type Run = (Vec<f64>, Vec<(String, Vec<f32>)>);

/// Every recompute choice gives `run(None)`'s losses and gradients, bit for bit.
fn assert_bit_identical(run: fn(Option<(RecomputeMethod, usize)>) -> Run) {
    let (want_losses, want_grads) = run(None);
    for choice in &CHOICES[1..] {
        let (losses, grads) = run(*choice);
        assert_eq!(losses, want_losses, "{choice:?}: losses");
        for ((name, got), (_, want)) in grads.iter().zip(&want_grads) {
            assert!(got == want, "{choice:?}: gradient of `{name}` differs");
        }
    }
}

#[test]
fn full_recompute_is_bit_identical_to_keeping_activations() {
    assert_bit_identical(back_to_back);
}

/// The pipeline-stash order of `pp_stash.rs`: three microbatches in flight, an eval forward,
/// backwards out of order.
fn in_flight(recompute: Option<(RecomputeMethod, usize)>) -> Run {
    let c = config(recompute);
    let bs = batches(&c, 4);
    let mut model = GptModel::new(c, backend(), ParallelContext::single()).unwrap();
    model.zero_grad().unwrap();
    let mut noop = |_: &[&megatron_core::Param]| Ok(());
    let mut losses = Vec::new();
    for (mb, b) in bs.iter().enumerate().take(3) {
        losses.push(loss_of(model.forward_stage(mb, b, None, Mode::Train).unwrap()));
    }
    losses.push(loss_of(model.forward_stage(99, &bs[0], None, Mode::Eval).unwrap()));
    model.backward_stage(1, None, 0.25, &mut noop).unwrap();
    model.backward_stage(0, None, 0.25, &mut noop).unwrap();
    losses.push(loss_of(model.forward_stage(3, &bs[3], None, Mode::Train).unwrap()));
    model.backward_stage(3, None, 0.25, &mut noop).unwrap();
    model.backward_stage(2, None, 0.25, &mut noop).unwrap();
    (losses, grads(&model))
}

#[test]
fn full_recompute_with_microbatches_in_flight_is_bit_identical() {
    assert_bit_identical(in_flight);
}

/// Bytes the decoder holds after the forward of the second iteration (steady state), and the
/// bytes of its recompute pool.
fn held_after_forward(recompute: Option<(RecomputeMethod, usize)>) -> (usize, usize) {
    let c = config(recompute);
    let b = batch(2, c.seq_length, c.vocab_size, 7);
    let mut model = GptModel::new(c, backend(), ParallelContext::single()).unwrap();
    model.forward(&b, Mode::Train).unwrap();
    model.backward(1.0).unwrap();
    model.forward(&b, Mode::Train).unwrap();
    (model.decoder.activation_bytes(), model.decoder.pooled_activation_bytes())
}

#[test]
fn full_recompute_keeps_only_unit_inputs_and_one_unit_of_activations() {
    let (none, none_pool) = held_after_forward(None);
    assert_eq!(none_pool, 0);
    // uniform 1: every layer's set is dropped after its forward; one set stays pooled.
    let (u1, set) = held_after_forward(Some((RecomputeMethod::Uniform, 1)));
    assert!(set > 0);
    assert_eq!(u1, none - (LAYERS - 1) * set, "uniform 1: one layer's activations plus the layer inputs");
    // uniform 2: two units of two layers; each unit's inner residual (B, T, C) f32 is dropped
    // and a backward holds a whole unit, so two sets stay pooled.
    let residual = 2 * 8 * 16 * 4;
    let (u2, pool2) = held_after_forward(Some((RecomputeMethod::Uniform, 2)));
    assert_eq!(pool2, 2 * set);
    assert_eq!(u2, none - (LAYERS - 2) * set - 2 * residual);
    // block 2: the first two layers recomputed, the last two keep theirs.
    let (b2, pool_b) = held_after_forward(Some((RecomputeMethod::Block, 2)));
    assert_eq!(pool_b, set);
    assert_eq!(b2, none - set);
}
