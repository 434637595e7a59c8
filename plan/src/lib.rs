//! `megatron-plan`: what a training layout costs before anything is allocated (issue 19).
//!
//! From plain shapes and layout ([`PlanInput`]) it computes, per pipeline stage (every rank of
//! a stage holds the same amount), the bytes of parameters, gradients, fp32 main parameters,
//! optimizer state (sharded over data parallelism with the distributed optimizer), the
//! activations the schedule keeps in flight (1F1B: stage `s` of `p` holds `min(p - s, M)`
//! microbatches; interleaved: Megatron's warm-up count of model chunks) under the recompute
//! policy and precision, the backward workspace ([`activations`]) and the largest
//! short-lived buffers of a step (gradient all-reduce, write-back, all-gather:
//! [`transients`]) ([`plan`]); the FLOPs per
//! iteration of SPEC §6.13 ([`flops_per_iteration`]); a step time from a measured GEMM rate,
//! the pipeline bubble and the communication volume per rank over a measured communicator
//! rate ([`step_time`]);
//! and, over a memory budget, what each of a smaller micro batch, more pipeline stages, the
//! distributed optimizer and bf16 would bring ([`suggestions`]).
//!
//! Ranks of `megatron pretrain --nproc` are threads of one process, so the process total is
//! the sum over ranks plus the process baseline (measured without a model), the quantity
//! compared with peak RSS (docs/plan.md).

pub mod activations;
pub mod report;
pub mod step_time;
pub mod transients;

pub use activations::{activation_bytes_per_microbatch_layer, decoder_activation_bytes};

/// Numeric format of parameters and activations (SPEC §6.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    Fp32,
    /// bf16 or fp16 parameters, fp32 main grads and main parameters in the optimizer.
    Half,
}

/// Activation recomputation (SPEC §6.9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recompute {
    None,
    /// `core_attn` only; our attention never stores the `T x T` scores, so this changes
    /// nothing but is accepted.
    Selective,
    /// Every layer keeps only its input; one layer is recomputed at a time in backward.
    Full,
}

/// Shapes and layout of a GPT run (the `pretrain` flags that matter for memory and time).
#[derive(Clone, Debug, PartialEq)]
pub struct PlanInput {
    pub num_layers: usize,
    pub hidden: usize,
    pub heads: usize,
    /// Query groups (GQA); `heads` without GQA.
    pub query_groups: usize,
    pub kv_channels: usize,
    pub ffn: usize,
    pub swiglu: bool,
    pub padded_vocab: usize,
    pub max_position_embeddings: usize,
    /// Learned absolute positions (false for RoPE).
    pub learned_positions: bool,
    pub untied: bool,
    pub seq: usize,
    pub micro_batch: usize,
    /// Microbatches per iteration and data-parallel rank.
    pub num_microbatches: usize,
    pub tp: usize,
    pub pp: usize,
    pub dp: usize,
    /// Model chunks per pipeline rank (interleaved 1F1B when > 1).
    pub virtual_pp: usize,
    /// Optimizer state floats per parameter (Adam 2, SGD with momentum 1).
    pub optimizer_floats: usize,
    pub distributed_optimizer: bool,
    pub precision: Precision,
    pub recompute: Recompute,
    /// DDP bucket size in elements (`--ddp-bucket-size`, Megatron's default with
    /// `--overlap-grad-reduce`); `None`: one bucket per stage.
    pub bucket_elems: Option<usize>,
    /// `--fp32-residual-connection`: the residual stream stays fp32 under half precision.
    pub fp32_residual: bool,
    /// RMSNorm (one statistic per token) instead of LayerNorm (two).
    pub rms_norm: bool,
    /// `--sequence-parallel` (with tp > 1): the residual stream, the norms and their outputs
    /// hold `1/tp` of the tokens ([`activations`]).
    pub sequence_parallel: bool,
    /// `--context-parallel-size`: every rank holds `seq / cp` tokens of each sequence.
    pub cp: usize,
}

impl PlanInput {
    /// Parameters of one transformer layer (whole, before TP splitting).
    pub fn layer_params(&self) -> u128 {
        let (h, f) = (self.hidden as u128, self.ffn as u128);
        let q = (self.heads * self.kv_channels) as u128;
        let kv = (2 * self.query_groups * self.kv_channels) as u128;
        let gates: u128 = if self.swiglu { 2 } else { 1 };
        let bias = !self.swiglu; // GPT-2 style layers carry biases, Llama style do not
        let b = |n: u128| if bias { n } else { 0 };
        let attn = h * (q + kv) + b(q + kv) + q * h + b(h);
        let mlp = h * f * gates + b(f * gates) + f * h + b(h);
        let norms = if bias { 4 * h } else { 2 * h };
        attn + mlp + norms
    }

    /// Parameters of one layer that every tensor-parallel rank holds whole: the norms and the
    /// biases of the row-parallel projections (attention output, second MLP linear).
    pub fn layer_replicated_params(&self) -> u128 {
        let h = self.hidden as u128;
        if self.swiglu {
            2 * h
        } else {
            4 * h + 2 * h
        }
    }

    /// Parameters held by one rank of pipeline stage `stage` (chunks of all its virtual stages).
    pub fn stage_params(&self, stage: usize) -> u128 {
        let (h, v) = (self.hidden as u128, self.padded_vocab as u128);
        let tp = self.tp as u128;
        let layers = stage_layer_count(self.num_layers, self.pp, stage) as u128;
        let whole = self.layer_replicated_params();
        let mut p = layers * ((self.layer_params() - whole) / tp + whole);
        let first = stage == 0;
        let last = stage + 1 == self.pp;
        if first {
            p += v * h / tp;
            if self.learned_positions {
                p += self.max_position_embeddings as u128 * h;
            }
        }
        if last {
            p += if self.swiglu { h } else { 2 * h }; // final norm
            if self.untied || self.pp > 1 {
                p += v * h / tp; // output layer, or the tied copy on the last stage
            }
        }
        p
    }
}

impl PlanInput {
    /// Elements of the largest single parameter one rank of stage `stage` holds (a DDP bucket
    /// closes after the parameter that reaches the bucket size, so it can exceed it by this).
    pub fn largest_param(&self, stage: usize) -> u128 {
        let (h, f, tp) = (self.hidden as u128, self.ffn as u128, self.tp as u128);
        let q = (self.heads * self.kv_channels) as u128;
        let kv = (2 * self.query_groups * self.kv_channels) as u128;
        let gates: u128 = if self.swiglu { 2 } else { 1 };
        let mut m = 0;
        if stage_layer_count(self.num_layers, self.pp, stage) > 0 {
            m = [h * (q + kv), q * h, h * f * gates, f * h].into_iter().max().unwrap_or(0) / tp;
        }
        let vocab = self.padded_vocab as u128 * h / tp;
        if stage == 0 || (stage + 1 == self.pp && (self.untied || self.pp > 1)) {
            m = m.max(vocab);
        }
        if stage == 0 && self.learned_positions {
            m = m.max(self.max_position_embeddings as u128 * h);
        }
        m
    }
}

/// Layers of stage `stage` when `num_layers` are split evenly (the first stages take the rest).
pub fn stage_layer_count(num_layers: usize, pp: usize, stage: usize) -> usize {
    num_layers / pp + usize::from(stage < num_layers % pp)
}

/// One pipeline stage's bytes per rank.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StagePlan {
    pub stage: usize,
    pub layers: usize,
    pub params: u128,
    pub param_bytes: u128,
    pub grad_bytes: u128,
    pub main_param_bytes: u128,
    pub optimizer_bytes: u128,
    /// Microbatches (model chunks for interleaving) whose activations are held at once.
    pub in_flight: usize,
    pub activation_bytes: u128,
    /// Backward scratch and gradient buffers allocated once per rank.
    pub workspace_bytes: u128,
    /// The largest short-lived buffers of a step and their phase ([`transients`]).
    pub transient_bytes: u128,
    pub transient_phase: &'static str,
}

impl StagePlan {
    pub fn total(&self) -> u128 {
        self.param_bytes
            + self.grad_bytes
            + self.main_param_bytes
            + self.optimizer_bytes
            + self.activation_bytes
            + self.workspace_bytes
            + self.transient_bytes
    }
}

/// The plan of a whole run.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub stages: Vec<StagePlan>,
    /// Ranks per stage (`tp x cp x dp`).
    pub ranks_per_stage: usize,
    /// The process without a model (binary, runtime, rank threads; measured, see [`plan`]).
    pub overhead_bytes: u128,
}

impl Plan {
    /// The process total: every rank is a thread of one process.
    pub fn process_bytes(&self) -> u128 {
        self.stages.iter().map(|s| s.total()).sum::<u128>() * self.ranks_per_stage as u128 + self.overhead_bytes
    }

    /// The largest per-rank total (what one GPU would have to hold).
    pub fn max_rank_bytes(&self) -> u128 {
        self.stages.iter().map(|s| s.total()).max().unwrap_or(0)
    }
}

/// Activations in flight on stage `stage`: 1F1B holds `min(pp - stage, M)` microbatches;
/// interleaved holds Megatron's warm-up chunks `(pp - stage - 1) * 2 + (v - 1) * pp + 1`
/// (capped at `M * v`), each chunk covering `1/v` of the stage's layers.
pub fn in_flight(input: &PlanInput, stage: usize) -> (usize, f64) {
    let (pp, m, v) = (input.pp, input.num_microbatches.max(1), input.virtual_pp.max(1));
    if pp == 1 {
        return (1, 1.0);
    }
    if v == 1 {
        return ((pp - stage).min(m), 1.0);
    }
    let chunks = ((pp - stage - 1) * 2 + (v - 1) * pp + 1).min(m * v);
    (chunks, 1.0 / v as f64)
}

/// Elements of a stage's `params` that one rank of `dp` owns with the distributed optimizer:
/// the first rank's (largest) share, `ceil(n_b / dp)` of every bucket `b`, at most
/// `ceil(N / dp) + buckets - 1` (exact with one bucket).
pub fn shard_elems(input: &PlanInput, params: u128) -> u128 {
    if !input.distributed_optimizer {
        return params;
    }
    // Every bucket but the last holds at least the bucket size.
    let buckets = input.bucket_elems.map_or(1, |b| params.div_ceil((b as u128).max(1)).max(1));
    params.div_ceil(input.dp.max(1) as u128) + buckets - 1
}

/// fp32 elements of the data-parallel reducer's own bucket buffers at their peak for `stage`
/// of `params` (tests/plan_counts.rs checks this against the real reducer): without the
/// distributed optimizer every reduced bucket until they are written back (all of them); with
/// it, the padded bucket being reduce-scattered plus this rank's reduced share of every
/// bucket. Nothing without data parallelism or the distributed optimizer (no reducer). The
/// copies the collectives and the write-back make on top are in [`transients`].
pub fn grad_buffer_elems(input: &PlanInput, stage: usize, params: u128) -> u128 {
    if input.distributed_optimizer {
        transients::largest_bucket(input, stage, params) + params.div_ceil(input.dp.max(1) as u128)
    } else if input.dp > 1 {
        params
    } else {
        0
    }
}

/// Plans `input` (see the crate docs).
pub fn plan(input: &PlanInput) -> Plan {
    let half = input.precision == Precision::Half;
    let stages = (0..input.pp)
        .map(|s| {
            let params = input.stage_params(s);
            let layers = stage_layer_count(input.num_layers, input.pp, s);
            let (flight, chunk_frac) = in_flight(input, s);
            let per_mb = activations::stage_activation_bytes(input, layers, s + 1 == input.pp);
            let transient = transients::peak_transient(input, s, params);
            StagePlan {
                stage: s,
                layers,
                params,
                param_bytes: params * if half { 2 } else { 4 },
                grad_bytes: params * 4, // fp32 main grads in every precision
                // fp32 main values of the half parameters: of the shard only with the
                // distributed optimizer (as Megatron), of every parameter otherwise.
                main_param_bytes: if half { shard_elems(input, params) * 4 } else { 0 },
                optimizer_bytes: shard_elems(input, params) * 4 * input.optimizer_floats as u128,
                in_flight: flight,
                activation_bytes: (per_mb as f64 * flight as f64 * chunk_frac) as u128,
                workspace_bytes: activations::workspace_bytes(input, s),
                transient_bytes: transient.bytes,
                transient_phase: transient.phase,
            }
        })
        .collect();
    Plan {
        stages,
        ranks_per_stage: input.tp * input.cp.max(1) * input.dp.max(1),
        // The process without a model: the peak RSS of a 1-layer, 64-wide `pretrain` run is
        // 12.3 / 16.5 / 21.3 MiB at 1 / 2 / 4 ranks (binary pages, libc, runtime, each rank's
        // thread and thread pool): 9 MiB + 3 MiB per rank.
        overhead_bytes: (9 << 20) + (input.tp * input.cp.max(1) * input.pp * input.dp.max(1)) as u128 * (3 << 20),
    }
}

/// FLOPs of one iteration of `samples` sequences (SPEC §6.13, dense layers, causal half).
pub fn flops_per_iteration(input: &PlanInput, samples: usize) -> f64 {
    let (h, s, l) = (input.hidden as f64, input.seq as f64, input.num_layers as f64);
    let np = input.heads as f64;
    let q_ratio = (input.kv_channels as f64 * np) / h;
    let g = input.query_groups as f64;
    let glu = if input.swiglu { 1.5 } else { 1.0 };
    let attn = 12.0 * l * h * h * ((1.0 + g / np + s / (2.0 * h)) * q_ratio);
    let mlp = 12.0 * l * h * (input.ffn as f64 * glu);
    let logits = 6.0 * h * input.padded_vocab as f64;
    samples as f64 * s * (mlp + attn + logits)
}

/// GEMM-bound seconds per iteration: the iteration's FLOPs spread evenly over `world` ranks
/// at `gemm_flops_per_s` each, with no bubble and no communication (the compute term of
/// [`step_time::predict`] when pp = 1).
pub fn predicted_step_seconds(input: &PlanInput, gemm_flops_per_s: f64) -> f64 {
    let samples = input.micro_batch * input.num_microbatches * input.dp.max(1);
    let world = (input.tp * input.pp * input.dp.max(1)) as f64;
    flops_per_iteration(input, samples) / (world * gemm_flops_per_s)
}

/// A change to the layout and the process bytes it would need.
#[derive(Clone, Debug, PartialEq)]
pub struct Suggestion {
    pub change: String,
    pub process_bytes: u128,
    pub fits: bool,
}

/// What to change when the plan exceeds `budget` bytes (empty when it fits).
pub fn suggestions(input: &PlanInput, budget: u128) -> Vec<Suggestion> {
    if plan(input).process_bytes() <= budget {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut try_one = |change: String, next: PlanInput| {
        let bytes = plan(&next).process_bytes();
        out.push(Suggestion { change, process_bytes: bytes, fits: bytes <= budget });
    };
    if input.recompute != Recompute::Full {
        try_one(
            "--recompute-granularity full --recompute-method uniform".into(),
            PlanInput { recompute: Recompute::Full, ..input.clone() },
        );
    }
    if input.micro_batch > 1 {
        let mb = input.micro_batch / 2;
        let more = input.num_microbatches * input.micro_batch / mb;
        try_one(
            format!("--micro-batch-size {mb} (same global batch: {more} microbatches)"),
            PlanInput { micro_batch: mb, num_microbatches: more, ..input.clone() },
        );
    }
    if input.num_layers >= input.pp * 2 {
        // With the same ranks (dp halves) the process holds fewer model replicas; with more
        // ranks each rank holds less but the process (all ranks) holds more.
        let pp = input.pp * 2;
        if input.dp >= 2 && input.dp.is_multiple_of(2) {
            let dp = input.dp / 2;
            let m = input.num_microbatches * 2;
            try_one(
                format!("--pipeline-model-parallel-size {pp} with the same ranks (dp {dp}, {m} microbatches)"),
                PlanInput { pp, dp, num_microbatches: m, ..input.clone() },
            );
        } else {
            try_one(
                format!("--pipeline-model-parallel-size {pp} (more ranks: less per rank, more per process)"),
                PlanInput { pp, ..input.clone() },
            );
        }
    }
    if input.dp > 1 && !input.distributed_optimizer {
        try_one("--use-distributed-optimizer".into(), PlanInput { distributed_optimizer: true, ..input.clone() });
    }
    if input.precision == Precision::Fp32 {
        try_one("--bf16".into(), PlanInput { precision: Precision::Half, ..input.clone() });
    }
    out
}
