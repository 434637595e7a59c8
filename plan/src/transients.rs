//! The short-lived buffers of a training step on top of what stays allocated, phase by phase
//! and per rank, from what the code allocates (each term names its variable). The ranks of
//! `--nproc` are threads that meet in every collective, so they pass through a phase
//! together: the process peak is the resident bytes plus the largest phase's bytes summed
//! over the ranks ([`peak_transient`]).
//!
//! The `local` communicator (plugins/comm-local) copies a tensor into the collective
//! (`input` clone), one rank sums the copies into the first one (the group's accumulator,
//! shared) and every rank takes its own copy of the result (`Outputs` clone) before the
//! buffer it replaces is freed: an all-reduce of `X` elements holds `X (1 + 1/g)` per rank of
//! a group of `g` on top of the tensor itself; an all-gather into `P` holds the gathered
//! accumulator shared and each rank's copy of it.

use crate::PlanInput;

/// The largest phase of a step: its name and bytes per rank.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Transient {
    pub phase: &'static str,
    pub bytes: u128,
}

/// fp32 elements of the largest data-parallel bucket of a stage with `params` elements: one
/// bucket without `--ddp-bucket-size`/overlap, else the size plus the parameter that closed it
/// (plugins/parallel/src/buckets.rs); padded to a multiple of dp for the distributed optimizer.
pub fn largest_bucket(input: &PlanInput, stage: usize, params: u128) -> u128 {
    let b = input.bucket_elems.map_or(params, |b| (b as u128 + input.largest_param(stage)).min(params));
    if input.distributed_optimizer {
        let dp = input.dp.max(1) as u128;
        b.div_ceil(dp) * dp
    } else {
        b
    }
}

/// Every phase of one rank's step with its bytes (see the module doc); `params` is the
/// stage's parameter count.
pub fn phases(input: &PlanInput, stage: usize, params: u128) -> Vec<Transient> {
    let dp = input.dp.max(1) as u128;
    let lp = input.largest_param(stage);
    let n = (input.micro_batch * input.seq) as u128;
    let act = crate::activations::act_bytes(input);
    let mut out = vec![Transient {
        // TransformerLayer::backward: `backend.copy(d_res, d_branch)` clones d_res (B, T, C);
        // with tp > 1 the row-parallel output all-reduce (its input copy, output copy and
        // accumulator share) is larger.
        phase: "forward/backward copies",
        bytes: n * input.hidden as u128 * act * if input.tp > 1 { 2 } else { 1 },
    }];
    if input.precision == crate::Precision::Half {
        // kernels/cpu/src/widen.rs: an op without a half kernel widens each half input to an
        // fp32 copy (`to_f32`) and computes into an fp32 stand-in for its output (`Out`). The
        // largest: the embedding lookup widens the whole word-embedding table (first stage);
        // the MLP activation widens `fc1_out` and writes an fp32 `act_out`.
        let (gates, f) = (if input.swiglu { 2 } else { 1 }, (input.ffn / input.tp) as u128);
        let table = if stage == 0 { (input.padded_vocab / input.tp) as u128 * input.hidden as u128 } else { 0 };
        let mlp = n * (gates * f + f);
        out.push(Transient { phase: "half inputs widened to fp32", bytes: table.max(mlp) * 4 });
    }
    let tied = !input.untied && input.pp > 1 && (stage == 0 || stage + 1 == input.pp);
    if tied {
        // finalize_grads: the word-embedding gradient all-reduced between the first and the
        // last stage (a group of 2): input copy + output copy + half the accumulator.
        let wte = (input.padded_vocab / input.tp) as u128 * input.hidden as u128;
        out.push(Transient { phase: "embedding-group all-reduce", bytes: (wte + wte / 2) * 4 });
    }
    if dp > 1 && !input.distributed_optimizer {
        let b = largest_bucket(input, stage, params);
        // DdpReducer::launch/finish_inner: the buckets reduced so far (`reduced`, at most all
        // N) plus the bucket tensor `t` in its all-reduce: input copy, output copy, accumulator
        // share.
        let all_reduce = params + b + b / dp;
        // Write-back: the reduced buckets not written yet (`reduced`, <= N), the host copy of
        // the bucket being written (`flat`) and, per parameter, its `g` Vec and the copy
        // `backend.copy` makes of it (the largest parameter).
        let write_back = params + b + 2 * lp;
        out.push(Transient { phase: "DDP all-reduce", bytes: all_reduce * 4 });
        out.push(Transient { phase: "DDP grad write-back", bytes: write_back * 4 });
    }
    if input.distributed_optimizer {
        let p = largest_bucket(input, stage, params);
        // This rank's reduced share of every bucket (`reduced`, the current one's `shard_out`
        // included), at most ceil(N/dp) + buckets - 1.
        let shares = crate::shard_elems(input, params);
        // reduce_scatter: the shares, the bucket tensor `t` and its input copy.
        let reduce_scatter = shares + 2 * p;
        // Write-back of the share (`flat`) with the per-parameter `g` Vec + its copy.
        let write_back = shares + p / dp + 2 * lp;
        // DistributedOptimizer::step, per segment: `local` (P/dp), the host copies of the
        // parameter's gradient and value and their `seg` slices (<= the parameter).
        let step = p / dp + 4 * lp;
        // DistributedOptimizer::gather: `input` (= local, P/dp), the gathered `out` (P), its
        // `to_host` copy (P) and the `to_f32_vec` copy of that (P).
        let gather = p / dp + 3 * p;
        out.push(Transient { phase: "reduce-scatter", bytes: reduce_scatter * 4 });
        out.push(Transient { phase: "grad write-back (shard)", bytes: write_back * 4 });
        out.push(Transient { phase: "optimizer step (shard)", bytes: step * 4 });
        out.push(Transient { phase: "param all-gather", bytes: gather * 4 });
    }
    out
}

/// The largest phase of [`phases`].
pub fn peak_transient(input: &PlanInput, stage: usize, params: u128) -> Transient {
    phases(input, stage, params).into_iter().max_by_key(|t| t.bytes).unwrap_or_default()
}
