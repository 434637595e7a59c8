//! Step time of a layout (issue 19): the iteration's GEMM FLOPs at a measured GEMM rate, the
//! 1F1B pipeline bubble, and the bytes every rank moves through the communicator per
//! iteration at a measured (or configured) communicator rate.
//!
//! The model, per pipeline stage `s` (every rank of a stage does the same work):
//! - one microbatch's forward + backward on `s` takes `c_s = FLOPs(s) / (tp * rate)` plus its
//!   tensor-parallel and pipeline transfers; 1F1B runs `M + pp - 1` such slots of the slowest
//!   stage (`pp - 1` of them are the bubble; interleaving divides those by `v`);
//! - after the pipeline: the data-parallel gradient reduction (all-reduce, or reduce-scatter +
//!   all-gather with the distributed optimizer), the tied-embedding all-reduce between the
//!   first and last stage (pp > 1), and the optimizer step, which is memory-bound (it reads
//!   and writes every state array once: its bytes at a measured memory streaming rate).
//!
//! Collectives are costed as `latency + bytes / rate`, where `bytes` is the tensor handed to
//! the call (the gathered size for all-gather, the input for reduce-scatter) and `rate` is the
//! measured payload rate of an all-reduce of the group's size; a send and its recv are one
//! transfer. This fits the `local` communicator (ranks are threads: every collective copies
//! its inputs, reduces them and copies the result out, so its cost grows with the payload,
//! not with a ring schedule). What it leaves out: non-GEMM kernels (norms, softmax,
//! activations) and the overlap of the data-parallel reduction with backward
//! (`--overlap-grad-reduce`).
//!
//! Rank contention ([`Contention`], [`predict_shared`]): ranks are threads of one process, so
//! they share the machine's cores. The GEMM rate is measured for one rank alone; when all
//! ranks compute at once, (a) ranks × threads beyond the cores are time-sliced, stretching
//! compute by `ranks·threads / cores`, and (b) ranks that each have their cores still share
//! caches, memory bandwidth and, on a loaded machine, the scheduler's share of the process:
//! `megatron plan` measures that as the GEMM rate of one rank while every rank that fits on
//! the cores runs the same GEMM at once, over its rate alone. Compute and the bubble's compute
//! are divided by both; communication and the optimizer keep their measured rates.

use crate::{flops_per_iteration, stage_layer_count, PlanInput, Precision};

/// Measured (or configured) speeds of one rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    /// GEMM FLOP/s of one rank with the threads it gets.
    pub gemm_flops_per_s: f64,
    /// Payload bytes per second of an all-reduce among the group (also used for sends).
    pub comm_bytes_per_s: f64,
    /// Fixed cost of one communicator call, seconds.
    pub comm_latency_s: f64,
    /// Bytes per second one rank streams through memory (the optimizer step).
    pub mem_bytes_per_s: f64,
}

/// Bytes and calls of one kind of communication per rank and iteration.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Traffic {
    pub bytes: f64,
    pub calls: f64,
}

impl Traffic {
    fn seconds(&self, r: &Rates) -> f64 {
        self.calls * r.comm_latency_s + self.bytes / r.comm_bytes_per_s
    }
}

/// The predicted step, term by term (seconds per iteration, on the slowest stage).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepTime {
    /// Forward + backward GEMM time of all microbatches (no bubble).
    pub compute_s: f64,
    /// The pipeline bubble: `(pp - 1) / v` extra microbatch slots of the slowest stage.
    pub bubble_s: f64,
    /// Tensor-parallel all-reduces (row-parallel outputs, column-parallel input gradients,
    /// vocab-parallel embedding and cross entropy), all microbatches.
    pub tp_comm_s: f64,
    /// Pipeline sends/receives of activations and their gradients, all microbatches.
    pub pp_comm_s: f64,
    /// Data-parallel gradient reduction plus the tied-embedding all-reduce (pp > 1).
    pub dp_comm_s: f64,
    /// The optimizer step (memory-bound).
    pub optimizer_s: f64,
    /// Extra compute (and bubble) time from ranks sharing cores ([`predict_shared`]).
    pub contention_s: f64,
    pub tp: Traffic,
    pub pp: Traffic,
    pub dp: Traffic,
}

impl StepTime {
    pub fn total_s(&self) -> f64 {
        self.compute_s
            + self.bubble_s
            + self.tp_comm_s
            + self.pp_comm_s
            + self.dp_comm_s
            + self.optimizer_s
            + self.contention_s
    }
}

/// How the ranks (threads of one process) share the machine's cores.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Contention {
    /// Cores the process may use.
    pub cores: usize,
    /// Compute threads of each rank (the GEMM rate was measured with these).
    pub threads_per_rank: usize,
    /// One rank's GEMM rate while the ranks that fit on the cores all run GEMMs at once, over
    /// its rate alone (1.0: no interference, or not measured).
    pub concurrent_ratio: f64,
}

impl Contention {
    /// No sharing: [`predict_shared`] equals [`predict`].
    pub const NONE: Contention = Contention { cores: usize::MAX, threads_per_rank: 1, concurrent_ratio: 1.0 };

    /// Time-slicing factor (≥ 1) of `ranks` ranks computing at once.
    pub fn oversubscription(&self, ranks: usize) -> f64 {
        ((ranks * self.threads_per_rank) as f64 / self.cores.max(1) as f64).max(1.0)
    }

    /// Factor (≥ 1) on one rank's compute time when `ranks` ranks compute at once.
    pub fn compute_slowdown(&self, ranks: usize) -> f64 {
        if ranks <= 1 {
            return 1.0;
        }
        self.oversubscription(ranks) / self.concurrent_ratio.clamp(1e-3, 1.0)
    }
}

/// Bytes of one activation element on the wire (the parameter dtype).
fn act_bytes(input: &PlanInput) -> f64 {
    if input.precision == Precision::Half {
        2.0
    } else {
        4.0
    }
}

/// Tensor-parallel traffic of one microbatch on stage `stage`: per layer two forward
/// all-reduces (attention projection and second MLP linear, row-parallel) and two backward
/// ones (input gradients of the column-parallel QKV and first MLP linear), each of
/// `(B, T, C)`; the first stage's vocab-parallel embedding lookup and the last stage's output
/// layer input gradient (`(B, T, C)` each) and cross entropy (three `(B, T)` fp32).
pub fn tp_traffic_per_microbatch(input: &PlanInput, stage: usize) -> Traffic {
    if input.tp <= 1 {
        return Traffic::default();
    }
    let btc = (input.micro_batch * input.seq * input.hidden) as f64 * act_bytes(input);
    let layers = stage_layer_count(input.num_layers, input.pp, stage) as f64;
    let mut t = Traffic { bytes: 4.0 * layers * btc, calls: 4.0 * layers };
    if stage == 0 {
        t.bytes += btc;
        t.calls += 1.0;
    }
    if stage + 1 == input.pp {
        t.bytes += btc + 3.0 * (input.micro_batch * input.seq) as f64 * 4.0;
        t.calls += 4.0;
    }
    t
}

/// Pipeline traffic of one microbatch on stage `stage`: the activation in and out and its
/// gradient back, `(B, T, C)` each, per neighbouring stage.
pub fn pp_traffic_per_microbatch(input: &PlanInput, stage: usize) -> Traffic {
    if input.pp <= 1 {
        return Traffic::default();
    }
    let btc = (input.micro_batch * input.seq * input.hidden) as f64 * act_bytes(input);
    let neighbours = f64::from(u8::from(stage > 0) + u8::from(stage + 1 < input.pp));
    // A send and its recv move the tensor once each way through the communicator's buffer.
    Traffic { bytes: 2.0 * neighbours * btc, calls: 2.0 * neighbours }
}

/// Data-parallel and embedding-group traffic of stage `stage` per iteration: the fp32
/// gradient all-reduce of the stage's parameters (distributed optimizer: reduce-scatter of the
/// gradients + all-gather of the parameters in their dtype) and, with pp > 1, the tied word
/// embedding's fp32 gradient all-reduce on the first and last stage.
pub fn dp_traffic(input: &PlanInput, stage: usize) -> Traffic {
    let params = input.stage_params(stage) as f64;
    let buckets = input.bucket_elems.map_or(1.0, |b| (params / b.max(1) as f64).ceil().max(1.0));
    let mut t = Traffic::default();
    if input.dp > 1 {
        if input.distributed_optimizer {
            t.bytes += params * 4.0 + params * act_bytes(input);
            t.calls += 2.0 * buckets;
        } else {
            t.bytes += params * 4.0;
            t.calls += buckets;
        }
    }
    let tied_end = stage == 0 || stage + 1 == input.pp;
    if input.pp > 1 && !input.untied && tied_end {
        t.bytes += (input.padded_vocab * input.hidden / input.tp) as f64 * 4.0;
        t.calls += 1.0;
    }
    t
}

/// Bytes the optimizer step reads and writes on one rank of `stage` (Adam: grad, param, two
/// moments read, param and moments written; plus the fp32 main copy and the half copy back
/// under half precision), over the elements this rank updates.
pub fn optimizer_bytes(input: &PlanInput, stage: usize) -> f64 {
    let params = input.stage_params(stage) as f64;
    let owned = if input.distributed_optimizer { params / input.dp.max(1) as f64 } else { params };
    let state = input.optimizer_floats as f64;
    let fp32_arrays = 3.0 + 2.0 * state; // grad read, (main) param read + write, state read + write
    let half_extra = if input.precision == Precision::Half { 2.0 } else { 0.0 }; // the half copy written back
    owned * (fp32_arrays * 4.0 + half_extra)
}

/// FLOPs of one microbatch's forward and backward on stage `stage` (its share of the layers;
/// the embedding-side logits on the last stage), whole before tensor parallelism.
fn stage_microbatch_flops(input: &PlanInput, stage: usize) -> f64 {
    let one = flops_per_iteration(input, input.micro_batch);
    let logits = 6.0 * (input.micro_batch * input.seq) as f64 * (input.hidden * input.padded_vocab) as f64;
    let layers = stage_layer_count(input.num_layers, input.pp, stage) as f64 / input.num_layers.max(1) as f64;
    (one - logits) * layers + if stage + 1 == input.pp { logits } else { 0.0 }
}

/// The step time of `input` at `rates` (see the module docs): the slowest stage decides.
pub fn predict(input: &PlanInput, rates: &Rates) -> StepTime {
    predict_shared(input, rates, &Contention::NONE)
}

/// [`predict`] with the ranks sharing cores as `contention` says: the compute of every
/// microbatch slot (bubble included) is stretched by [`Contention::compute_slowdown`] of all
/// `tp · pp · dp` ranks (they all compute at once in steady state); the stretch is reported
/// as `contention_s`.
pub fn predict_shared(input: &PlanInput, rates: &Rates, contention: &Contention) -> StepTime {
    let slowdown = contention.compute_slowdown(input.tp * input.pp * input.dp);
    let m = input.num_microbatches.max(1) as f64;
    let bubble_slots = (input.pp - 1) as f64 / input.virtual_pp.max(1) as f64;
    let mut worst = StepTime::default();
    for s in 0..input.pp {
        let compute_mb = stage_microbatch_flops(input, s) / (input.tp as f64 * rates.gemm_flops_per_s);
        let tp = tp_traffic_per_microbatch(input, s);
        let pp = pp_traffic_per_microbatch(input, s);
        let slot = compute_mb + tp.seconds(rates) + pp.seconds(rates);
        let dp = dp_traffic(input, s);
        let st = StepTime {
            compute_s: m * compute_mb,
            bubble_s: bubble_slots * slot,
            contention_s: (m + bubble_slots) * compute_mb * (slowdown - 1.0),
            tp_comm_s: m * tp.seconds(rates),
            pp_comm_s: m * pp.seconds(rates),
            dp_comm_s: dp.seconds(rates),
            optimizer_s: optimizer_bytes(input, s) / rates.mem_bytes_per_s,
            tp: Traffic { bytes: m * tp.bytes, calls: m * tp.calls },
            pp: Traffic { bytes: m * pp.bytes, calls: m * pp.calls },
            dp,
        };
        if st.total_s() > worst.total_s() {
            worst = st;
        }
    }
    worst
}
