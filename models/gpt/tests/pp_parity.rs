//! Pipeline parallelism: the tiny GPT split into pp = 2 / 4 stages (and tp = 2 x pp = 2, and
//! uneven first/last stage sizes at pp = 2 / 3), run
//! with the `1f1b` schedule over the threads communicator, matches the single-stage model
//! run with `no-pipelining` on the same microbatches: identical initial parameters (global
//! layer names and seeds), per-microbatch losses and, after `finalize_grads`, every gradient
//! (the tied word embedding's copy on the last stage included), and the same global gradient
//! norm (the shared copy counted once).

mod common;

use common::*;
use megatron_comm_local::LocalCommunicator;
use megatron_core::{Batch, LossReport, Model, ParallelContext, Param, RankGrid, Schedule};
use megatron_gpt::{GptConfig, GptModel};
use megatron_parallel::{NoPipelining, OneFOneB};
use std::collections::BTreeMap;
use std::time::Duration;

/// One parameter of one rank after the step.
#[derive(Clone, Debug)]
struct ParamOut {
    shape: Vec<usize>,
    tp_axis: Option<usize>,
    shared_copy: bool,
    value: Vec<f32>,
    grad: Vec<f32>,
}

/// What one rank reports: its coordinates, loss reports, parameters by name, the names the
/// grads-ready hook reported (in order) and the global gradient norm.
struct RankOut {
    pp_rank: usize,
    tp_rank: usize,
    reports: Vec<LossReport>,
    params: BTreeMap<String, ParamOut>,
    ready: Vec<String>,
    norm: f64,
}

fn snapshot(model: &GptModel) -> BTreeMap<String, ParamOut> {
    let bk = model.backend();
    let host = |t| bk.to_host(t).unwrap().to_f32_vec();
    model
        .params()
        .iter()
        .map(|p| {
            let out = ParamOut {
                shape: p.value.shape().to_vec(),
                tp_axis: p.layout.tp_axis,
                shared_copy: p.layout.shared_copy,
                value: host(&p.value),
                grad: host(&p.grad),
            };
            (p.name.clone(), out)
        })
        .collect()
}

fn run_rank(config: GptConfig, ctx: ParallelContext, batches: &[Batch], schedule: &mut dyn Schedule) -> RankOut {
    run_rank_mode(config, ctx, batches, schedule, false)
}

fn run_rank_mode(
    config: GptConfig,
    ctx: ParallelContext,
    batches: &[Batch],
    schedule: &mut dyn Schedule,
    forward_only: bool,
) -> RankOut {
    let mut model = GptModel::new(config, backend(), ctx.clone()).unwrap();
    let bk = model.backend();
    model.zero_grad().unwrap();
    let mut queue = batches.iter().cloned();
    let mut next = || queue.next().ok_or_else(|| megatron_core::anyhow::anyhow!("out of batches"));
    let mut ready = Vec::new();
    let mut hook = |ps: &[&Param]| {
        ready.extend(ps.iter().map(|p| p.name.clone()));
        Ok(())
    };
    let reports =
        schedule.run_with_grad_hook(&mut model, &mut next, batches.len(), forward_only, &ctx, &mut hook).unwrap();
    model.finalize_grads().unwrap();
    let norm = megatron_optim::grad_norm(&model.params(), bk.as_ref(), &ctx).unwrap();
    RankOut { pp_rank: ctx.pp_rank, tp_rank: ctx.tp_rank, reports, params: snapshot(&model), ready, norm }
}

/// Runs every rank of a `tp x pp` world as a thread with the 1F1B schedule.
fn run_pipeline(config: &GptConfig, tp: usize, pp: usize, batches: &[Batch]) -> Vec<RankOut> {
    run_pipeline_mode(config, tp, pp, batches, false)
}

fn run_pipeline_mode(config: &GptConfig, tp: usize, pp: usize, batches: &[Batch], forward_only: bool) -> Vec<RankOut> {
    let world = tp * pp;
    let grid = RankGrid::new(world, tp, 1, pp).unwrap();
    let comms = LocalCommunicator::world(world, Duration::from_secs(120));
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, comm)| {
                let (cfg, ctx) = (config.clone(), grid.context(r, comm.clone()));
                s.spawn(move || run_rank_mode(cfg, ctx, batches, &mut OneFOneB, forward_only))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Reassembles a tp = 1 tensor from the shards of `tp` ranks (`chunks` blocks along dim 0 for
/// the gated fc1, whose local layout is `[gate_local; up_local]`).
fn assemble(shards: &[&ParamOut], chunks: usize, grads: bool) -> Vec<f32> {
    let data = |p: &ParamOut| if grads { p.grad.clone() } else { p.value.clone() };
    match shards[0].tp_axis {
        None => data(shards[0]),
        Some(0) => {
            let block = shards[0].value.len() / chunks;
            (0..chunks)
                .flat_map(|c| shards.iter().flat_map(move |s| data(s)[c * block..(c + 1) * block].to_vec()))
                .collect()
        }
        Some(_) => {
            let (rows, cols) = (shards[0].shape[0], shards[0].shape[1]);
            (0..rows)
                .flat_map(|r| shards.iter().flat_map(move |s| data(s)[r * cols..(r + 1) * cols].to_vec()))
                .collect()
        }
    }
}

/// Max absolute difference relative to the largest reference magnitude.
fn rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let max = b.iter().fold(1e-12f64, |m, &x| m.max(x.abs() as f64));
    a.iter().zip(b).fold(0f64, |m, (&x, &y)| m.max((x as f64 - y as f64).abs())) / max
}

fn batches(config: &GptConfig, m: usize) -> Vec<Batch> {
    (0..m).map(|i| batch(2, config.seq_length, config.vocab_size, 100 + i as u64)).collect()
}

/// Checks a `tp x pp` 1F1B run against the single-stage run on `m` microbatches.
fn check_pipeline_matches_single_stage(config: &GptConfig, tp: usize, pp: usize, m: usize) {
    let batches = batches(config, m);
    let reference = run_rank(config.clone(), ParallelContext::single(), &batches, &mut NoPipelining);
    let ranks = run_pipeline(config, tp, pp, &batches);

    // Losses: every TP rank of the last stage reports every microbatch; no other stage does.
    for r in &ranks {
        if r.pp_rank + 1 == pp {
            assert_eq!(r.reports.len(), m);
            for (mb, (got, want)) in r.reports.iter().zip(&reference.reports).enumerate() {
                let err = (got.loss_sum - want.loss_sum).abs() / want.loss_sum.abs();
                assert!(err < 1e-5, "tp{tp} pp{pp} M{m} microbatch {mb}: loss {} vs {}", got.loss_sum, want.loss_sum);
                assert_eq!(got.num_tokens, want.num_tokens);
            }
        } else {
            assert!(r.reports.is_empty(), "stage {} must report no losses", r.pp_rank);
        }
        let err = (r.norm - reference.norm).abs() / reference.norm;
        assert!(
            err < 1e-5,
            "tp{tp} pp{pp} M{m} rank grad norm {} vs {} (shared copy counted once?)",
            r.norm,
            reference.norm
        );
    }

    // The grads-ready hook reports every parameter of the stage exactly once.
    for r in &ranks {
        let mut names = r.ready.clone();
        names.sort();
        let want: Vec<String> = r.params.keys().cloned().collect();
        assert_eq!(names, want, "stage {} tp {}: on_grads_ready must report each parameter once", r.pp_rank, r.tp_rank);
    }

    // Parameters: every reference parameter lives on exactly one stage (plus the tied copy).
    let mut worst = (String::new(), 0f64);
    for (name, want) in &reference.params {
        let owners: Vec<usize> =
            (0..pp).filter(|&s| ranks.iter().any(|r| r.pp_rank == s && r.params.contains_key(name))).collect();
        let expected_owners =
            if name == "embedding.word_embeddings.weight" && !config.untie_embeddings_and_output_weights {
                vec![0, pp - 1]
            } else {
                vec![owners.first().copied().unwrap_or(usize::MAX)]
            };
        assert_eq!(owners, expected_owners, "stages holding `{name}`");
        for &stage in &owners {
            let shards: Vec<&ParamOut> = (0..tp)
                .map(|t| &ranks.iter().find(|r| r.pp_rank == stage && r.tp_rank == t).unwrap().params[name])
                .collect();
            assert_eq!(shards[0].shared_copy, stage != 0 && owners.len() == 2, "`{name}` shared_copy flag");
            let chunks = if config.swiglu && name.contains("linear_fc1") { 2 } else { 1 };
            assert_eq!(assemble(&shards, chunks, false), want.value, "initial `{name}` on stage {stage}");
            let err = rel(&assemble(&shards, chunks, true), &want.grad);
            if err > worst.1 {
                worst = (format!("{name}@{stage}"), err);
            }
            assert!(err < 1e-5, "tp{tp} pp{pp} M{m}: gradient of `{name}` on stage {stage}: relative error {err:.3e}");
        }
    }
    let extra: Vec<&String> =
        ranks.iter().flat_map(|r| r.params.keys()).filter(|n| !reference.params.contains_key(*n)).collect();
    assert!(extra.is_empty(), "stages hold parameters the single-stage model lacks: {extra:?}");
    println!("tp{tp} pp{pp} M{m}: worst gradient {} {:.3e}", worst.0, worst.1);
}

fn dropout_config(num_layers: usize) -> GptConfig {
    let mut c = tiny_config(64, 8);
    c.num_layers = num_layers;
    // Masks are seeded by (microbatch seed, GLOBAL layer number): identical in every split,
    // and the recomputed forward of an earlier stage draws them again.
    c.hidden_dropout = 0.1;
    c.attention_dropout = 0.1;
    c
}

#[test]
fn pp2_matches_single_stage_for_1_3_8_microbatches() {
    let c = dropout_config(2);
    for m in [1, 3, 8] {
        check_pipeline_matches_single_stage(&c, 1, 2, m);
    }
}

#[test]
fn pp4_matches_single_stage() {
    let c = dropout_config(4);
    for m in [3, 8] {
        check_pipeline_matches_single_stage(&c, 1, 4, m);
    }
}

#[test]
fn pp2_untied_swiglu_rmsnorm_matches_single_stage() {
    let mut c = dropout_config(4);
    c.untie_embeddings_and_output_weights = true;
    c.swiglu = true;
    c.normalization = megatron_transformer::NormKind::RMSNorm;
    check_pipeline_matches_single_stage(&c, 1, 2, 3);
}

#[test]
fn llama_style_pp2_and_tp2_pp2_match_single_stage() {
    let mut c = tiny_llama_config(64, 8);
    c.num_layers = 4;
    c.hidden_dropout = 0.1;
    check_pipeline_matches_single_stage(&c, 1, 2, 3);
    check_pipeline_matches_single_stage(&c, 2, 2, 2);
}

#[test]
fn qk_layernorm_rope_scaling_tp2_pp2_matches_single_stage() {
    let mut c = tiny_llama_config(64, 8);
    c.num_layers = 4;
    c.qk_layernorm = true;
    c.rope_scaling = megatron_core::RopeScaling::Linear { factor: 2.0 };
    check_pipeline_matches_single_stage(&c, 2, 2, 2);
}

#[test]
fn tp2_pp2_matches_single_stage() {
    let mut c = tiny_config(64, 8);
    c.num_layers = 4;
    c.hidden_dropout = 0.1; // acts on replicated activations: the same mask at any TP size
    check_pipeline_matches_single_stage(&c, 2, 2, 3);
}

/// Uneven splits (`--decoder-first/last-pipeline-num-layers`) keep global layer numbers, so
/// they train the single-stage model: pp = 2 as 3+1 and 1+3, pp = 3 as 1+2+1 of 4 layers.
#[test]
fn uneven_pp2_and_pp3_match_single_stage() {
    let mut c = dropout_config(4);
    c.decoder_first_pipeline_num_layers = Some(3);
    check_pipeline_matches_single_stage(&c, 1, 2, 3);
    c.decoder_first_pipeline_num_layers = None;
    c.decoder_last_pipeline_num_layers = Some(3);
    check_pipeline_matches_single_stage(&c, 1, 2, 2);
    c.decoder_first_pipeline_num_layers = Some(1);
    c.decoder_last_pipeline_num_layers = Some(1);
    check_pipeline_matches_single_stage(&c, 1, 3, 4);
}

#[test]
fn uneven_stage_ranges_and_errors() {
    let mut c = dropout_config(4);
    c.decoder_first_pipeline_num_layers = Some(1);
    c.decoder_last_pipeline_num_layers = Some(1);
    let grid = RankGrid::new(3, 1, 1, 3).unwrap();
    let comms = LocalCommunicator::world(3, Duration::from_secs(5));
    let ranges: Vec<_> = (0..3)
        .map(|r| GptModel::new(c.clone(), backend(), grid.context(r, comms[r].clone())).unwrap().layer_range())
        .collect();
    assert_eq!(ranges, vec![0..1, 1..3, 3..4]);
    // First = 1 alone leaves 3 layers for the 2 other stages: not an even split.
    c.decoder_last_pipeline_num_layers = None;
    let err = GptModel::new(c.clone(), backend(), grid.context(1, comms[1].clone())).err().unwrap().to_string();
    assert!(
        err.contains("--decoder-first-pipeline-num-layers 1") && err.contains("split evenly over the 2 other"),
        "{err}"
    );
    c.decoder_first_pipeline_num_layers = Some(0);
    let err = GptModel::new(c, backend(), grid.context(0, comms[0].clone())).err().unwrap().to_string();
    assert!(err.contains("--decoder-first-pipeline-num-layers must be larger than 0"), "{err}");
}

#[test]
fn stage_split_errors_name_the_flags() {
    let c = tiny_config(64, 8); // 2 layers
    let grid = RankGrid::new(4, 1, 1, 4).unwrap();
    let comms = LocalCommunicator::world(4, Duration::from_secs(5));
    let err = GptModel::new(c.clone(), backend(), grid.context(0, comms[0].clone())).err().unwrap().to_string();
    assert!(err.contains("--num-layers 2") && err.contains("--pipeline-model-parallel-size 4"), "{err}");
    // A stage model refuses the whole-model calls instead of computing something partial.
    let grid = RankGrid::new(2, 1, 1, 2).unwrap();
    let comms = LocalCommunicator::world(2, Duration::from_secs(5));
    let mut last = GptModel::new(c, backend(), grid.context(1, comms[1].clone())).unwrap();
    assert!(!last.is_first_stage() && last.is_last_stage());
    assert_eq!(last.layer_range(), 1..2);
    let b = batch(1, 8, 64, 1);
    let err = last.forward(&b, megatron_core::Mode::Train).unwrap_err().to_string();
    assert!(err.contains("1f1b"), "{err}");
    let err = last.forward_stage(0, &b, None, megatron_core::Mode::Train).unwrap_err().to_string();
    assert!(err.contains("previous stage"), "{err}");
}

#[test]
fn pp4_forward_only_losses_match_and_touch_no_gradient() {
    let c = dropout_config(4);
    let batches = batches(&c, 5);
    let reference = run_rank_mode(c.clone(), ParallelContext::single(), &batches, &mut NoPipelining, true);
    for r in run_pipeline_mode(&c, 1, 4, &batches, true) {
        assert!(r.ready.is_empty(), "forward-only runs report no gradients");
        assert!(r.params.values().all(|p| p.grad.iter().all(|&g| g == 0.0)), "stage {} got gradients", r.pp_rank);
        if r.pp_rank == 3 {
            assert_eq!(r.reports.len(), 5);
            for (got, want) in r.reports.iter().zip(&reference.reports) {
                // Eval: dropout off on both sides, so the same arithmetic on the same inputs.
                assert!((got.loss_sum - want.loss_sum).abs() <= 1e-5 * want.loss_sum.abs(), "{got:?} vs {want:?}");
            }
        } else {
            assert!(r.reports.is_empty());
        }
    }
}
