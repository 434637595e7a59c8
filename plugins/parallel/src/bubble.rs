//! The pipeline bubble of a schedule order, by simulation: every rank runs its actions in
//! order, one at a time; a forward of virtual stage `s` waits for the same microbatch's
//! forward on stage `s − 1`, a backward for the backward on stage `s + 1` (communication
//! free). A chunk's forward takes `t_f / vp` and its backward `t_b / vp` (it holds `1/vp` of
//! the rank's layers). The bubble is the makespan minus a rank's compute, `M·(t_f + t_b)`,
//! relative to that compute: Megatron's `(pp − 1) / (vp·M)` for a well-formed order. Used by
//! the tests of both 1F1B orders and printed next to the measured bubble
//! (`scripts/interleaved_bubble.sh`).

use crate::interleaved::{interleaved_order, ChunkAction};
use crate::one_f_one_b::{one_f_one_b_order, PipelineAction};
use anyhow::{bail, Result};
use std::collections::HashMap;

/// Simulated bubble / compute of the schedule of `pp` ranks with `vp` chunks each (`vp = 1`:
/// plain 1F1B) on `m` microbatches in groups of `pp`.
pub fn simulated_bubble(pp: usize, vp: usize, m: usize, t_f: f64, t_b: f64) -> Result<f64> {
    // Per rank: (is_forward, microbatch, chunk).
    let orders: Vec<Vec<(bool, usize, usize)>> = (0..pp)
        .map(|r| {
            Ok(if vp == 1 {
                one_f_one_b_order(pp, r, m, false)
                    .into_iter()
                    .map(|a| match a {
                        PipelineAction::Forward(mb) => (true, mb, 0),
                        PipelineAction::Backward(mb) => (false, mb, 0),
                    })
                    .collect()
            } else {
                interleaved_order(pp, r, vp, m, pp, false)?
                    .into_iter()
                    .map(|a| match a {
                        ChunkAction::Forward { microbatch, chunk } => (true, microbatch, chunk),
                        ChunkAction::Backward { microbatch, chunk } => (false, microbatch, chunk),
                    })
                    .collect()
            })
        })
        .collect::<Result<_>>()?;
    let stages = pp * vp;
    // Finish time of (forward?, microbatch, virtual stage).
    let mut done: HashMap<(bool, usize, usize), f64> = HashMap::new();
    let mut next = vec![0usize; pp];
    let mut clock = vec![0.0f64; pp];
    let total: usize = orders.iter().map(Vec::len).sum();
    let mut finished = 0;
    while finished < total {
        let mut progressed = false;
        for r in 0..pp {
            while let Some(&(fwd, mb, c)) = orders[r].get(next[r]) {
                let s = c * pp + r;
                let dep = match (fwd, s) {
                    (true, 0) => Some(0.0),
                    (true, s) => done.get(&(true, mb, s - 1)).copied(),
                    (false, s) if s + 1 == stages => done.get(&(true, mb, s)).copied(),
                    (false, s) => done.get(&(false, mb, s + 1)).copied(),
                };
                let Some(ready) = dep else { break };
                let start = clock[r].max(ready);
                clock[r] = start + if fwd { t_f } else { t_b } / vp as f64;
                done.insert((fwd, mb, s), clock[r]);
                next[r] += 1;
                finished += 1;
                progressed = true;
            }
        }
        if !progressed {
            bail!("the schedule of pp {pp}, vp {vp}, {m} microbatches deadlocks");
        }
    }
    let makespan = clock.iter().copied().fold(0.0, f64::max);
    let compute = m as f64 * (t_f + t_b);
    Ok((makespan - compute) / compute)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bubble_fraction;

    #[test]
    fn simulated_bubbles_match_megatrons_formula() {
        for (pp, vp, m) in [(2, 1, 8), (4, 1, 8), (2, 2, 8), (4, 2, 8), (4, 2, 4), (2, 4, 6), (4, 3, 12)] {
            for (t_f, t_b) in [(1.0, 2.0), (1.0, 1.0)] {
                let sim = simulated_bubble(pp, vp, m, t_f, t_b).unwrap();
                let formula = bubble_fraction(pp, vp, m);
                assert!(
                    (sim - formula).abs() < 1e-9,
                    "pp {pp} vp {vp} M {m} t_f {t_f} t_b {t_b}: simulated {sim}, formula {formula}"
                );
            }
        }
    }
}
