//! The order of Megatron's interleaved 1F1B schedule (SPEC §5.5, virtual pipeline stages):
//! which `(microbatch, model chunk)` a rank runs at each step, and the rules on the number of
//! microbatches. Rank `r` of `pp` holds `vp` model chunks; chunk `c` is virtual stage
//! `c·pp + r`.
//!
//! The virtual microbatch table: microbatches in groups of `N` (default `pp`), each group run
//! through chunk 0, then chunk 1, …, chunk `vp − 1` (the last group may be smaller). Forward
//! step `k` runs table entry `k`; backward step `k` runs the same microbatch on chunk
//! `vp − 1 − c`. Rank `r` warms up with `(pp − r − 1)·2 + (vp − 1)·N` forwards (at most
//! `M·vp`; if that reaches the total, all forwards then all backwards), then alternates one
//! forward and one backward, then drains the backwards.
//!
//! The table and warmup counts agree with megatron-core 0.16.1 (`get_schedule_table`,
//! `get_pp_rank_microbatches`, checked by hand for the cases in the tests).
//!
//! The `interleaved-1f1b` schedule (`interleaved_schedule.rs`) runs this order.

use anyhow::{bail, Result};

/// One step of a rank's interleaved schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkAction {
    /// Forward of `microbatch` through model chunk `chunk`.
    Forward { microbatch: usize, chunk: usize },
    /// Backward of `microbatch` through model chunk `chunk`.
    Backward { microbatch: usize, chunk: usize },
}

/// Checks Megatron's constraints on the interleaved schedule (never silently adjusted):
/// `pp > 1`, `vp > 1`, `pp ≤ N ≤ M` and `M mod N` either 0 or `≥ pp`.
pub fn check_interleaving(pp: usize, vp: usize, num_microbatches: usize, group: usize) -> Result<()> {
    let m = num_microbatches;
    if pp < 2 {
        bail!(
            "an interleaved (virtual-stage) pipeline needs --pipeline-model-parallel-size >= 2, got {pp}; drop \
             --num-layers-per-virtual-pipeline-stage / --num-virtual-stages-per-pipeline-rank"
        );
    }
    if vp < 2 {
        bail!("an interleaved pipeline needs at least 2 model chunks per rank, got {vp}");
    }
    if group < pp || group > m {
        bail!(
            "the interleaved schedule runs microbatches in groups of N = {group} (default: pp) with pp <= N <= \
             number of microbatches; here pp = {pp} and there are {m} microbatches (global batch / (micro batch \
             x dp)); raise --global-batch-size so there are at least {pp} microbatches"
        );
    }
    let rest = m % group;
    if rest != 0 && rest < pp {
        bail!(
            "{m} microbatches in groups of {group} leave a last group of {rest} < pp = {pp}; the interleaved \
             schedule needs the number of microbatches to be a multiple of {group} or to leave at least {pp} \
             (change --global-batch-size)"
        );
    }
    Ok(())
}

/// The `(microbatch, chunk)` table of the forward steps (length `M·vp`).
pub fn virtual_microbatch_table(vp: usize, num_microbatches: usize, group: usize) -> Vec<(usize, usize)> {
    let mut table = Vec::with_capacity(num_microbatches * vp);
    for start in (0..num_microbatches).step_by(group.max(1)) {
        let end = (start + group).min(num_microbatches);
        for chunk in 0..vp {
            table.extend((start..end).map(|mb| (mb, chunk)));
        }
    }
    table
}

/// Warmup forwards of rank `rank` (capped at the `M·vp` total).
pub fn interleaved_warmup(pp: usize, rank: usize, vp: usize, num_microbatches: usize, group: usize) -> usize {
    ((pp - rank - 1) * 2 + (vp - 1) * group).min(num_microbatches * vp)
}

/// The full order of rank `rank` (forward-only: every forward in table order).
pub fn interleaved_order(
    pp: usize,
    rank: usize,
    vp: usize,
    num_microbatches: usize,
    group: usize,
    forward_only: bool,
) -> Result<Vec<ChunkAction>> {
    check_interleaving(pp, vp, num_microbatches, group)?;
    let table = virtual_microbatch_table(vp, num_microbatches, group);
    let fwd = |k: usize| ChunkAction::Forward { microbatch: table[k].0, chunk: table[k].1 };
    if forward_only {
        return Ok((0..table.len()).map(fwd).collect());
    }
    let bwd = |k: usize| ChunkAction::Backward { microbatch: table[k].0, chunk: vp - 1 - table[k].1 };
    let total = table.len();
    let warmup = interleaved_warmup(pp, rank, vp, num_microbatches, group);
    let mut order: Vec<ChunkAction> = (0..warmup).map(fwd).collect();
    for k in 0..total - warmup {
        order.push(fwd(warmup + k));
        order.push(bwd(k));
    }
    order.extend((total - warmup..total).map(bwd));
    Ok(order)
}

/// The idealised bubble fraction `(pp − 1) / (vp·M)` (plain 1F1B: `vp = 1`).
pub fn bubble_fraction(pp: usize, vp: usize, num_microbatches: usize) -> f64 {
    (pp as f64 - 1.0) / (vp * num_microbatches) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use ChunkAction::{Backward as B, Forward as F};

    #[test]
    fn spec_example_table() {
        // SPEC §5.5: pp = 2, vp = 2, M = 5, N = 3.
        let t = virtual_microbatch_table(2, 5, 3);
        assert_eq!(t, vec![(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (3, 0), (4, 0), (3, 1), (4, 1)]);
        check_interleaving(2, 2, 5, 3).unwrap();
    }

    #[test]
    fn warmup_steady_cooldown_pp2_vp2_m4() {
        // Rank 0: warmup (2-0-1)*2 + 1*2 = 4 forwards, then 4 x (F, B).
        let o = interleaved_order(2, 0, 2, 4, 2, false).unwrap();
        let f = |microbatch, chunk| F { microbatch, chunk };
        let b = |microbatch, chunk| B { microbatch, chunk };
        assert_eq!(
            o,
            vec![
                f(0, 0),
                f(1, 0),
                f(0, 1),
                f(1, 1), // warmup
                f(2, 0),
                b(0, 1),
                f(3, 0),
                b(1, 1),
                f(2, 1),
                b(0, 0),
                f(3, 1),
                b(1, 0),
                b(2, 1),
                b(3, 1),
                b(2, 0),
                b(3, 0), // cooldown
            ]
        );
        // Rank 1 (last): warmup 2.
        assert_eq!(interleaved_warmup(2, 1, 2, 4, 2), 2);
        // Every (microbatch, chunk) runs forward and backward exactly once, forward first.
        for rank in 0..2 {
            let o = interleaved_order(2, rank, 2, 4, 2, false).unwrap();
            for mb in 0..4 {
                for c in 0..2 {
                    let fi = o.iter().position(|a| *a == f(mb, c)).unwrap();
                    let bi = o.iter().position(|a| *a == b(mb, c)).unwrap();
                    assert!(fi < bi);
                }
            }
            assert_eq!(o.len(), 16);
        }
    }

    #[test]
    fn warmup_reaching_the_total_runs_all_forwards_first() {
        // pp = 4, rank 0, vp = 2, M = 4, N = 4: warmup 6 + 4 = 10 > 8 -> 8.
        let o = interleaved_order(4, 0, 2, 4, 4, false).unwrap();
        assert!(o[..8].iter().all(|a| matches!(a, F { .. })));
        assert!(o[8..].iter().all(|a| matches!(a, B { .. })));
    }

    #[test]
    fn constraint_errors_state_the_rule() {
        let e = check_interleaving(4, 2, 3, 4).unwrap_err().to_string();
        assert!(e.contains("pp <= N") && e.contains("3 microbatches"), "{e}");
        let e = check_interleaving(4, 2, 6, 4).unwrap_err().to_string();
        assert!(e.contains("last group of 2 < pp = 4"), "{e}");
        check_interleaving(4, 2, 8, 4).unwrap();
        check_interleaving(2, 2, 5, 2).unwrap_err(); // 5 % 2 = 1 < 2
        assert!(check_interleaving(1, 2, 4, 1).unwrap_err().to_string().contains(">= 2"));
        assert!((bubble_fraction(4, 2, 8) - 3.0 / 16.0).abs() < 1e-12);
    }
}
