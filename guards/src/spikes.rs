//! The loss and gradient-norm spike detectors of one run (`--spike-threshold`,
//! `--grad-norm-spike-threshold`, `--spike-window`) judged together: an iteration either is
//! healthy — then both values join their histories — or is a spike of one of them and joins
//! neither (its update is not applied, so it must not shift what "normal" means).

use crate::{Spike, SpikeDetector, SpikeScore};
use std::collections::VecDeque;

/// Which value spiked, with the detector's numbers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SpikeVerdict {
    Loss(Spike),
    GradNorm(Spike),
}

impl SpikeVerdict {
    /// `"loss spike: 6.1 vs expected 1.20 ± 0.05 (trend of up to 20 recent iterations,
    /// z 98.0 > 6)"`.
    pub fn describe(&self, window: usize, threshold: f64) -> String {
        self.describe_scored(window, threshold, SpikeScore::Trend)
    }

    /// [`Self::describe`] naming the score that judged.
    pub fn describe_scored(&self, window: usize, threshold: f64, score: SpikeScore) -> String {
        let (what, s) = match self {
            SpikeVerdict::Loss(s) => ("loss", s),
            SpikeVerdict::GradNorm(s) => ("grad-norm", s),
        };
        let basis = match score {
            SpikeScore::Trend => "trend",
            SpikeScore::Mean => "mean",
        };
        format!(
            "{what} spike: {:.4} vs expected {:.4} ± {:.4} ({basis} of up to {window} recent iterations, z {:.1} > {threshold})",
            s.value, s.expected, s.spread, s.z
        )
    }

    /// The detector's numbers.
    pub fn spike(&self) -> &Spike {
        match self {
            SpikeVerdict::Loss(s) | SpikeVerdict::GradNorm(s) => s,
        }
    }
}

/// Both detectors (either may be off).
#[derive(Clone, Debug)]
pub struct SpikeGuards {
    loss: Option<SpikeDetector>,
    grad_norm: Option<SpikeDetector>,
    /// The iteration of each value in the histories (oldest first), so a rewind can drop the
    /// values of the iterations it undoes.
    iterations: VecDeque<u64>,
}

impl SpikeGuards {
    /// `None` thresholds switch a detector off; both score with [`SpikeScore::Trend`].
    pub fn new(window: usize, loss_threshold: Option<f64>, grad_norm_threshold: Option<f64>) -> SpikeGuards {
        SpikeGuards::with_score(window, loss_threshold, grad_norm_threshold, SpikeScore::Trend)
    }

    /// [`Self::new`] with the given score (`--spike-score`).
    pub fn with_score(
        window: usize,
        loss_threshold: Option<f64>,
        grad_norm_threshold: Option<f64>,
        score: SpikeScore,
    ) -> SpikeGuards {
        SpikeGuards {
            loss: loss_threshold.map(|z| SpikeDetector::with_score(window, z, score)),
            grad_norm: grad_norm_threshold.map(|z| SpikeDetector::with_score(window, z, score)),
            iterations: VecDeque::new(),
        }
    }

    /// [`Self::check`] of iteration `iteration` (remembered for [`Self::forget_after`]).
    pub fn check_at(&mut self, iteration: u64, loss: f64, grad_norm: f64) -> Option<SpikeVerdict> {
        let verdict = self.check(loss, grad_norm);
        if verdict.is_none() {
            *self.iterations.back_mut().expect("check just accepted a value") = iteration;
        }
        verdict
    }

    /// A rewind to `iteration`: the values of later iterations leave the histories (the replay
    /// brings them again; judged against their own future they would look like spikes).
    pub fn forget_after(&mut self, iteration: u64) {
        while self.iterations.back().is_some_and(|&i| i > iteration) {
            self.iterations.pop_back();
            for d in [&mut self.loss, &mut self.grad_norm].into_iter().flatten() {
                d.forget_last();
            }
        }
    }

    pub fn is_active(&self) -> bool {
        self.loss.is_some() || self.grad_norm.is_some()
    }

    /// Judges one iteration's finite `loss` and `grad_norm`; a healthy one joins the histories.
    pub fn check(&mut self, loss: f64, grad_norm: f64) -> Option<SpikeVerdict> {
        let verdict = self
            .loss
            .as_ref()
            .and_then(|d| d.judge(loss))
            .map(SpikeVerdict::Loss)
            .or_else(|| self.grad_norm.as_ref().and_then(|d| d.judge(grad_norm)).map(SpikeVerdict::GradNorm));
        if verdict.is_none() {
            if let Some(d) = &mut self.loss {
                d.accept(loss);
            }
            if let Some(d) = &mut self.grad_norm {
                d.accept(grad_norm);
            }
            let window = self.loss.iter().chain(&self.grad_norm).map(|d| d.window).max().unwrap_or(0);
            if self.iterations.len() == window {
                self.iterations.pop_front();
            }
            self.iterations.push_back(self.iterations.back().map_or(1, |i| i + 1));
        }
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spike_of_either_value_keeps_both_histories_clean() {
        let mut g = SpikeGuards::new(8, Some(5.0), Some(5.0));
        for i in 0..8 {
            let wiggle = if i % 2 == 0 { 0.01 } else { -0.01 };
            assert_eq!(g.check(2.0 + wiggle, 1.0 - wiggle), None, "iteration {i}");
        }
        let Some(SpikeVerdict::GradNorm(s)) = g.check(2.0, 9.0) else { panic!("grad-norm spike missed") };
        assert!(s.z > 5.0 && (s.expected - 1.0).abs() < 1e-9);
        let Some(SpikeVerdict::Loss(_)) = g.check(7.0, 1.0) else { panic!("loss spike missed") };
        // Neither spike entered a history: the same ordinary values still pass, and the
        // same spikes are still caught.
        assert_eq!(g.check(2.01, 0.99), None);
        assert!(matches!(g.check(2.0, 9.0), Some(SpikeVerdict::GradNorm(_))));
        let off = SpikeGuards::new(8, None, None);
        assert!(!off.is_active());
    }

    #[test]
    fn a_rewind_forgets_the_undone_iterations() {
        let mut g = SpikeGuards::new(12, Some(5.0), None);
        for i in 1..=10u64 {
            assert_eq!(g.check_at(i, 5.0 - 0.3 * i as f64 + 0.01 * (i % 2) as f64, 1.0), None);
        }
        // Back to iteration 6: 7..=10 leave; the replayed 7 is judged against 1..=6 only.
        g.forget_after(6);
        assert_eq!(g.iterations.iter().copied().collect::<Vec<_>>(), vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(g.check_at(7, 5.0 - 2.1 + 0.01, 1.0), None);
        assert_eq!(g.iterations.back(), Some(&7));
    }
}
