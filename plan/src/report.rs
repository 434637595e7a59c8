//! The plan as text: one row per pipeline stage (bytes per rank), the process total, the
//! FLOPs and predicted step time, and the suggestions when over budget.

use crate::{flops_per_iteration, plan, predicted_step_seconds, suggestions, PlanInput};

/// Bytes as MiB/GiB with two decimals.
pub fn human(bytes: u128) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    }
}

/// The printed plan; `gemm_flops_per_s` gives the step-time line, `budget` the suggestions.
pub fn render(input: &PlanInput, gemm_flops_per_s: Option<f64>, budget: u128) -> String {
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
    if let Some(rate) = gemm_flops_per_s {
        s += &format!(
            "predicted step time: {:.3} s at {:.1} GFLOP/s per rank (GEMM-bound)\n",
            predicted_step_seconds(input, rate),
            rate / 1e9
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
