//! Full activation recomputation (`--recompute-granularity full`, SPEC §6.9): the layers of a
//! recompute unit keep nothing for backward but the unit's input; their backward re-runs the
//! unit's forward first (same [`crate::StepInfo`], so the same dropout masks and bit-identical
//! activations) and then backpropagates through it.
//!
//! Megatron's two methods, over the layers of one pipeline stage:
//! - `uniform`: the stage's layers in consecutive units of `--recompute-num-layers`; only each
//!   unit's input stays in memory, and a backward holds one unit's activations at a time.
//! - `block`: the first `--recompute-num-layers` layers of the stage are recomputed one by one;
//!   the others keep their activations (less recomputation when memory allows).
//!
//! Selective recomputation of `core_attn` needs nothing here: our attention always rebuilds
//! its `(B, heads, T, T)` scores from `qkv` and the log-sum-exp in backward.

use serde::{Deserialize, Serialize};
use std::ops::Range;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecomputeMethod {
    Uniform,
    Block,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FullRecompute {
    pub method: RecomputeMethod,
    /// `--recompute-num-layers`: the unit size (`uniform`) or the number of recomputed layers
    /// of each stage (`block`); at least 1.
    pub num_layers: usize,
}

impl FullRecompute {
    /// The recompute units over a stage of `n` layers (local indices), in layer order. Layers
    /// in no unit keep their activations.
    pub fn units(&self, n: usize) -> Vec<Range<usize>> {
        let k = self.num_layers.max(1);
        match self.method {
            RecomputeMethod::Uniform => (0..n).step_by(k).map(|s| s..(s + k).min(n)).collect(),
            RecomputeMethod::Block => (0..k.min(n)).map(|l| l..l + 1).collect(),
        }
    }

    /// For every layer of an `n`-layer stage, the unit it belongs to.
    pub fn unit_of_layers(&self, n: usize) -> Vec<Option<Range<usize>>> {
        let mut of = vec![None; n];
        for u in self.units(n) {
            for l in u.clone() {
                of[l] = Some(u.clone());
            }
        }
        of
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_units_cover_the_stage_with_a_short_last_unit() {
        let r = FullRecompute { method: RecomputeMethod::Uniform, num_layers: 2 };
        assert_eq!(r.units(5), vec![0..2, 2..4, 4..5]);
        let one = FullRecompute { method: RecomputeMethod::Uniform, num_layers: 1 };
        assert_eq!(one.units(3), vec![0..1, 1..2, 2..3]);
    }

    #[test]
    fn block_recomputes_the_first_layers_one_by_one() {
        let r = FullRecompute { method: RecomputeMethod::Block, num_layers: 2 };
        assert_eq!(r.units(4), vec![0..1, 1..2]);
        assert_eq!(r.units(1), vec![0..1]);
        assert_eq!(r.unit_of_layers(3), vec![Some(0..1), Some(1..2), None]);
    }
}
