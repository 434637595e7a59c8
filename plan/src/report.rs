//! The plan as text: one row per pipeline stage (bytes per rank), the process total, the
//! FLOPs and predicted step time, and the suggestions when over budget.

use crate::step_time::{predict_shared, Contention, Rates};
use crate::{flops_per_iteration, plan, suggestions, PlanInput};

/// Bytes as MiB/GiB with two decimals.
pub fn human(bytes: u128) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    }
}

/// The printed plan; `rates` give the step-time lines, `budget` the suggestions.
pub fn render(input: &PlanInput, rates: Option<Rates>, budget: u128) -> String {
    render_shared(input, rates, &Contention::NONE, budget)
}

/// [`render`] with the ranks sharing cores as `contention` says (the step time's
/// `contention` term).
pub fn render_shared(input: &PlanInput, rates: Option<Rates>, contention: &Contention, budget: u128) -> String {
    let p = plan(input);
    let mut s = format!(
        "plan: tp {} x pp {} x dp {} ({} ranks, virtual pp {}), micro batch {} x {} microbatches, seq {}, {:?}, recompute {:?}, {}optimizer ({} floats/param)\n",
        input.tp,
        input.pp,
        input.dp,
        input.tp * input.pp * input.dp,
        input.virtual_pp,
        input.micro_batch,
        input.num_microbatches,
        input.seq,
        input.precision,
        input.recompute,
        if input.distributed_optimizer { "distributed " } else { "" },
        input.optimizer_floats,
    );
    s += &format!(
        "{:>5} {:>6} {:>12} {:>11} {:>11} {:>11} {:>11} {:>9} {:>12} {:>11} {:>11} {:>11}  {}\n",
        "stage",
        "layers",
        "params/rank",
        "params",
        "grads",
        "main",
        "optimizer",
        "in-flight",
        "activations",
        "workspace",
        "transient",
        "total/rank",
        "transient phase"
    );
    for st in &p.stages {
        s += &format!(
            "{:>5} {:>6} {:>12} {:>11} {:>11} {:>11} {:>11} {:>9} {:>12} {:>11} {:>11} {:>11}  {}\n",
            st.stage,
            st.layers,
            st.params,
            human(st.param_bytes),
            human(st.grad_bytes),
            human(st.main_param_bytes),
            human(st.optimizer_bytes),
            st.in_flight,
            human(st.activation_bytes),
            human(st.workspace_bytes),
            human(st.transient_bytes),
            human(st.total()),
            st.transient_phase,
        );
    }
    s += &format!(
        "process total ({} ranks per stage as threads + runtime {}): {} ({} bytes); largest rank {}\n",
        p.ranks_per_stage,
        human(p.overhead_bytes),
        human(p.process_bytes()),
        p.process_bytes(),
        human(p.max_rank_bytes())
    );
    let samples = input.micro_batch * input.num_microbatches * input.dp;
    s += &format!("FLOPs per iteration ({samples} samples): {:.6e}\n", flops_per_iteration(input, samples));
    if let Some(r) = rates {
        let t = predict_shared(input, &r, contention);
        s += &format!(
            "predicted step time: {:.3} s (compute {:.3} + bubble {:.3} + tp comm {:.3} + pp comm {:.3} + dp comm {:.3} + optimizer {:.3} + contention {:.3}) at {:.1} GFLOP/s per rank, communicator {:.2} GB/s + {:.0} us per call, memory {:.2} GB/s\n",
            t.total_s(),
            t.compute_s,
            t.bubble_s,
            t.tp_comm_s,
            t.pp_comm_s,
            t.dp_comm_s,
            t.optimizer_s,
            t.contention_s,
            r.gemm_flops_per_s / 1e9,
            r.comm_bytes_per_s / 1e9,
            r.comm_latency_s * 1e6,
            r.mem_bytes_per_s / 1e9,
        );
        let ranks = input.tp * input.pp * input.dp;
        if ranks > 1 && *contention != Contention::NONE {
            s += &format!(
                "rank contention: {ranks} ranks x {} threads on {} cores (time-sliced x{:.2}), concurrent GEMM rate {:.2} of one rank alone: compute x{:.2}\n",
                contention.threads_per_rank,
                contention.cores,
                contention.oversubscription(ranks),
                contention.concurrent_ratio,
                contention.compute_slowdown(ranks),
            );
        }
        s += &format!(
            "communication per rank and iteration (slowest stage): tp {} in {} calls, pp {} in {} calls, dp {} in {} calls\n",
            human(t.tp.bytes as u128),
            t.tp.calls,
            human(t.pp.bytes as u128),
            t.pp.calls,
            human(t.dp.bytes as u128),
            t.dp.calls,
        );
    }
    let sug = suggestions(input, budget);
    if p.process_bytes() > budget {
        s += &format!("DOES NOT FIT the memory budget {}; options:\n", human(budget));
        for x in &sug {
            s += &format!(
                "  {:<60} -> {} {}\n",
                x.change,
                human(x.process_bytes),
                if x.fits { "(fits)" } else { "(still over)" }
            );
        }
    } else {
        s += &format!("fits the memory budget {}\n", human(budget));
    }
    s
}
