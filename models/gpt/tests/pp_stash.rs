//! Pipeline stages keep the activations of every in-flight microbatch: under 1F1B every stage
//! runs exactly one forward per microbatch (no recomputation in backward), and a stage that
//! interleaves forwards and backwards out of order (eval forwards included) produces the same
//! losses and gradients as running each microbatch's forward and backward back to back.

mod common;

use common::*;
use megatron_comm_local::LocalCommunicator;
use megatron_core::{Batch, Mode, Model, ParallelContext, RankGrid, Schedule, StageOutput};
use megatron_gpt::{GptConfig, GptModel};
use megatron_parallel::OneFOneB;
use std::time::Duration;

fn dropout_config(num_layers: usize) -> GptConfig {
    let mut c = tiny_config(64, 8);
    c.num_layers = num_layers;
    c.hidden_dropout = 0.1;
    c.attention_dropout = 0.1;
    c
}

fn batches(config: &GptConfig, m: usize) -> Vec<Batch> {
    (0..m).map(|i| batch(2, config.seq_length, config.vocab_size, 300 + i as u64)).collect()
}

/// Per rank of a pp-stage 1F1B run of `iterations` global batches of `m` microbatches:
/// `(pp_rank, forward_count, stashed_activation_bytes)` at the end.
fn one_f_one_b_counts(pp: usize, m: usize, iterations: usize) -> Vec<(usize, usize, usize)> {
    let config = dropout_config(pp);
    let batches = batches(&config, m);
    let grid = RankGrid::new(pp, 1, 1, pp).unwrap();
    let comms = LocalCommunicator::world(pp, Duration::from_secs(120));
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, comm)| {
                let (cfg, ctx, batches) = (config.clone(), grid.context(r, comm.clone()), &batches);
                s.spawn(move || {
                    let mut model = GptModel::new(cfg, backend(), ctx.clone()).unwrap();
                    for _ in 0..iterations {
                        model.zero_grad().unwrap();
                        let mut queue = batches.iter().cloned();
                        let mut next = || queue.next().ok_or_else(|| megatron_core::anyhow::anyhow!("out of batches"));
                        OneFOneB.run(&mut model, &mut next, m, false, &ctx).unwrap();
                    }
                    (ctx.pp_rank, model.forward_count(), model.stashed_activation_bytes())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn one_f_one_b_runs_one_forward_per_microbatch_on_every_stage() {
    let (m, iterations) = (8, 2);
    for pp in [2, 4] {
        for (stage, forwards, spare_bytes) in one_f_one_b_counts(pp, m, iterations) {
            assert_eq!(forwards, m * iterations, "pp{pp} stage {stage}: forwards run (a backward recomputed?)");
            if stage + 1 == pp {
                // 1F1B runs each backward right after its forward there: nothing is ever moved.
                assert_eq!(spare_bytes, 0, "pp{pp} last stage allocated extra activation sets");
            } else {
                // Earlier stages keep pp - stage microbatches in flight; their sets stay allocated
                // as spares for the next iteration.
                assert!(spare_bytes > 0, "pp{pp} stage {stage} never stashed activations");
            }
        }
    }
}

fn loss_of(out: StageOutput) -> f64 {
    match out {
        StageOutput::Loss(r) => r.loss_sum,
        StageOutput::Hidden(_) => panic!("a single-stage model returns the loss"),
    }
}

fn grads(model: &GptModel) -> Vec<(String, Vec<f32>)> {
    let bk = model.backend();
    model.params().iter().map(|p| (p.name.clone(), bk.to_host(&p.grad).unwrap().to_f32_vec())).collect()
}

#[test]
fn out_of_order_stage_backwards_match_back_to_back_microbatches() {
    let config = dropout_config(2);
    let batches = batches(&config, 4);
    let scale = 0.25;

    // Reference: each microbatch's forward and backward back to back (nothing ever stashed).
    let mut reference = GptModel::new(config.clone(), backend(), ParallelContext::single()).unwrap();
    reference.zero_grad().unwrap();
    let mut want_losses = Vec::new();
    for b in &batches {
        want_losses.push(reference.forward(b, Mode::Train).unwrap().loss_sum);
        reference.backward(scale).unwrap();
    }
    assert_eq!(reference.stashed_activation_bytes(), 0);

    // Three in flight (the last stage's logits and cross-entropy statistics are stashed too),
    // backwards in another order, an eval forward in between.
    let mut model = GptModel::new(config, backend(), ParallelContext::single()).unwrap();
    model.zero_grad().unwrap();
    let mut got_losses = [0f64; 4];
    let mut noop = |_: &[&megatron_core::Param]| Ok(());
    for (mb, b) in batches.iter().enumerate().take(3) {
        got_losses[mb] = loss_of(model.forward_stage(mb, b, None, Mode::Train).unwrap());
    }
    let eval = loss_of(model.forward_stage(99, &batches[0], None, Mode::Eval).unwrap());
    assert!(model.stashed_activation_bytes() > 0, "three microbatches in flight but nothing stashed");
    assert!(model.backward_stage(1, None, scale, &mut noop).unwrap().is_none());
    assert!(model.backward_stage(0, None, scale, &mut noop).unwrap().is_none());
    got_losses[3] = loss_of(model.forward_stage(3, &batches[3], None, Mode::Train).unwrap());
    model.backward_stage(3, None, scale, &mut noop).unwrap();
    model.backward_stage(2, None, scale, &mut noop).unwrap();
    assert_eq!(model.forward_count(), 5, "4 training forwards and 1 eval forward, none recomputed");
    let err = model.backward_stage(2, None, scale, &mut noop).unwrap_err().to_string();
    assert!(err.contains("without its training forward"), "{err}");

    // Same arithmetic on the same inputs: losses exact, gradients up to summation order.
    assert_eq!(got_losses.to_vec(), want_losses);
    assert!((eval - want_losses[0]).abs() > 1e-9, "eval (no dropout) must differ from the dropout loss");
    for ((name, got), (_, want)) in grads(&model).iter().zip(&grads(&reference)) {
        let max = want.iter().fold(1e-12f32, |m, &x| m.max(x.abs()));
        let diff = got.iter().zip(want).fold(0f32, |m, (&a, &b)| m.max((a - b).abs()));
        assert!(diff / max < 1e-5, "gradient of `{name}`: relative error {:.3e}", diff / max);
    }
}
