//! The `no-pipelining` schedule with a recording fake model: microbatch order, train/eval
//! mode, the backward scale `1 / max(num_tokens, 1) / M` (SPEC §6.8) and the error paths.

mod common;

use common::FakeComm;
use megatron_core::anyhow::{bail, Result};
use megatron_core::{Batch, DeviceTensor, LossReport, Mode, Model, ParallelContext, ParallelStrategy, Param, Schedule};
use megatron_parallel::{MegatronStrategy, NoPipelining, StrategyConfig};
use std::sync::Arc;

/// Reports `loss_sum = seed`, `num_tokens = Σ loss_mask`; records every call.
#[derive(Default)]
struct RecordingModel {
    forwards: Vec<(u64, Mode)>,
    backward_scales: Vec<f32>,
    fail_forward_at: Option<u64>,
}

impl Model for RecordingModel {
    fn name(&self) -> &str {
        "recording"
    }
    fn forward(&mut self, batch: &Batch, mode: Mode) -> Result<LossReport> {
        if self.fail_forward_at == Some(batch.seed) {
            bail!("forward of microbatch {} failed", batch.seed);
        }
        self.forwards.push((batch.seed, mode));
        let num_tokens = batch.loss_mask.iter().map(|&m| m as f64).sum();
        Ok(LossReport { loss_sum: batch.seed as f64, num_tokens })
    }
    fn backward(&mut self, grad_scale: f32) -> Result<()> {
        self.backward_scales.push(grad_scale);
        Ok(())
    }
    fn logits(&mut self, _: &[i32], _: usize, _: usize) -> Result<DeviceTensor> {
        bail!("not used")
    }
    fn params(&self) -> Vec<&Param> {
        Vec::new()
    }
    fn params_mut(&mut self) -> Vec<&mut Param> {
        Vec::new()
    }
    fn zero_grad(&mut self) -> Result<()> {
        Ok(())
    }
    fn flops_per_iteration(&self, _: usize) -> f64 {
        0.0
    }
}

/// Microbatch `i` (seed `i`) has `mask[i]` tokens counting towards the loss.
fn batches(masks: &[usize]) -> impl FnMut() -> Result<Batch> + '_ {
    let mut i = 0;
    move || {
        let n = masks[i];
        let batch = Batch {
            micro_batch_size: 1,
            seq_length: 8,
            tokens: vec![0; 8],
            labels: vec![0; 8],
            loss_mask: (0..8).map(|t| if t < n { 1.0 } else { 0.0 }).collect(),
            seed: i as u64,
        };
        i += 1;
        Ok(batch)
    }
}

#[test]
fn training_scales_each_backward_by_its_tokens_and_the_microbatch_count() {
    let mut model = RecordingModel::default();
    let masks = [8, 2, 0];
    let mut next = batches(&masks);
    let reports = NoPipelining.run(&mut model, &mut next, 3, false, &ParallelContext::single()).unwrap();
    assert_eq!(model.forwards, [(0, Mode::Train), (1, Mode::Train), (2, Mode::Train)]);
    // 1/8/3, 1/2/3, and a fully masked microbatch divides by max(0, 1) = 1.
    let want = [1.0 / 24.0, 1.0 / 6.0, 1.0 / 3.0];
    assert_eq!(model.backward_scales.len(), 3);
    for (got, want) in model.backward_scales.iter().zip(want) {
        assert!((*got as f64 - want).abs() < 1e-7, "{got} vs {want}");
    }
    let tokens: Vec<f64> = reports.iter().map(|r| r.num_tokens).collect();
    assert_eq!(tokens, [8.0, 2.0, 0.0]);
    let losses: Vec<f64> = reports.iter().map(|r| r.loss_sum).collect();
    assert_eq!(losses, [0.0, 1.0, 2.0]);
}

#[test]
fn forward_only_runs_eval_without_backward() {
    let mut model = RecordingModel::default();
    let masks = [4, 4];
    let reports = NoPipelining.run(&mut model, &mut batches(&masks), 2, true, &ParallelContext::single()).unwrap();
    assert_eq!(model.forwards, [(0, Mode::Eval), (1, Mode::Eval)]);
    assert!(model.backward_scales.is_empty());
    assert_eq!(reports.len(), 2);
}

#[test]
fn errors_stop_the_run() {
    let mut model = RecordingModel { fail_forward_at: Some(1), ..RecordingModel::default() };
    let masks = [4, 4, 4];
    let err = NoPipelining.run(&mut model, &mut batches(&masks), 3, false, &ParallelContext::single()).unwrap_err();
    assert!(err.to_string().contains("microbatch 1"));
    assert_eq!(model.backward_scales.len(), 1, "nothing after the failing microbatch");

    let mut failing_loader = || -> Result<Batch> { bail!("the data loader ran out") };
    let err = NoPipelining.run(&mut model, &mut failing_loader, 1, false, &ParallelContext::single()).unwrap_err();
    assert!(err.to_string().contains("ran out"));

    let err = NoPipelining.run(&mut model, &mut batches(&masks), 0, false, &ParallelContext::single()).unwrap_err();
    assert!(err.to_string().contains("microbatch"));
}

#[test]
fn pipeline_parallel_contexts_are_rejected() {
    let config = StrategyConfig { pipeline_model_parallel_size: 2, ..StrategyConfig::default() };
    let ctx = MegatronStrategy::new(config).unwrap().build_context(Arc::new(FakeComm::new(0, 2))).unwrap();
    let mut model = RecordingModel::default();
    let masks = [1];
    let err = NoPipelining.run(&mut model, &mut batches(&masks), 1, false, &ctx).unwrap_err().to_string();
    assert!(err.contains("--pipeline-model-parallel-size") && err.contains("1F1B"), "{err}");
    assert!(model.forwards.is_empty());
}
