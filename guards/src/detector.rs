//! [`SpikeDetector`]: is a new loss (or grad norm) far above what the recent history predicts?
//!
//! Two scores over the last `window` accepted values:
//! * [`SpikeScore::Trend`] (default): a robust straight line through the history — the
//!   Theil–Sen slope (median of all pairwise slopes) and the median intercept — gives the
//!   expected value: one step on when it rises, its value at the last point when it falls (so
//!   a descent that slows down near its plateau is not taken for a jump); the spread is the mean absolute residual from that line, scaled to a standard
//!   deviation for normal noise ([`residual_std`]). A steep loss descent is the trend, not
//!   noise, so it neither inflates the spread nor hides a jump (the plain mean/std did: in the
//!   guards_spike corpus a jump from 0.41 to 1.88 during the descent was missed at window 10).
//!   The medians of the fit ignore a few odd values in the window; the mean absolute residual
//!   (rather than the median one, the MAD) stays positive on short or tied histories, where
//!   more than half of the points can sit exactly on the line.
//! * [`SpikeScore::Mean`]: the plain z-score against the window's mean and standard deviation.
//!
//! Both floor the spread at `1e-3 × |expected|` so a perfectly flat (or perfectly linear)
//! history does not flag tiny changes.

use std::collections::VecDeque;

/// How a value is compared with the history.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpikeScore {
    /// Residual from a robust (Theil–Sen) linear trend, in standard deviations of the noise
    /// around it.
    #[default]
    Trend,
    /// Distance from the mean in standard deviations.
    Mean,
}

impl SpikeScore {
    pub fn parse(s: &str) -> Result<SpikeScore, String> {
        match s {
            "trend" => Ok(SpikeScore::Trend),
            "mean" => Ok(SpikeScore::Mean),
            other => Err(format!("--spike-score `{other}`: expected trend or mean")),
        }
    }
}

/// A value far outside the recent ones: `z = (value - expected) / spread`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spike {
    pub value: f64,
    /// What the history predicts (the trend line at this iteration, or the mean).
    pub expected: f64,
    /// The history's spread around that prediction (robust or plain standard deviation).
    pub spread: f64,
    pub z: f64,
}

/// Score over the last `window` accepted values; needs `min_history` of them before it
/// judges, and a spike is not added to the history (a run of spikes stays visible).
#[derive(Clone, Debug)]
pub struct SpikeDetector {
    pub window: usize,
    pub threshold: f64,
    pub min_history: usize,
    pub score: SpikeScore,
    history: VecDeque<f64>,
}

/// Median of `v` (sorted in place); `NaN` for an empty slice.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// Theil–Sen line `y ≈ a + b·i` through `ys` at `i = 0, 1, ...`: `b` the median pairwise
/// slope, `a` the median of `y_i - b·i`. Returns `(a, b)`.
pub fn theil_sen(ys: &[f64]) -> (f64, f64) {
    let mut slopes = Vec::with_capacity(ys.len() * ys.len().saturating_sub(1) / 2);
    for i in 0..ys.len() {
        for j in i + 1..ys.len() {
            slopes.push((ys[j] - ys[i]) / (j - i) as f64);
        }
    }
    let b = if slopes.is_empty() { 0.0 } else { median(&mut slopes) };
    let mut intercepts: Vec<f64> = ys.iter().enumerate().map(|(i, y)| y - b * i as f64).collect();
    (median(&mut intercepts), b)
}

/// Standard deviation of the noise around a fitted line from its `residuals`: the mean
/// absolute residual times `sqrt(pi/2)` (normal noise: `E|x| = sigma sqrt(2/pi)`), times
/// `sqrt(n / (n - 2))` for the two fitted parameters (a line through 2 points has no residual).
pub fn residual_std(residuals: &[f64]) -> f64 {
    let n = residuals.len() as f64;
    if n <= 2.0 {
        return 0.0;
    }
    let mean_abs = residuals.iter().map(|r| r.abs()).sum::<f64>() / n;
    mean_abs * (std::f64::consts::PI / 2.0).sqrt() * (n / (n - 2.0)).sqrt()
}

impl SpikeDetector {
    /// A trend-scored detector ([`SpikeScore::Trend`]).
    pub fn new(window: usize, threshold: f64) -> SpikeDetector {
        SpikeDetector::with_score(window, threshold, SpikeScore::Trend)
    }

    pub fn with_score(window: usize, threshold: f64, score: SpikeScore) -> SpikeDetector {
        // A line needs a few points more than a mean to be trusted.
        let window = window.max(if score == SpikeScore::Trend { 4 } else { 2 });
        let min_history = (window / 2).max(if score == SpikeScore::Trend { 4 } else { 2 });
        SpikeDetector { window, threshold, min_history, score, history: VecDeque::new() }
    }

    /// Judges `value` against the history, then (if not a spike) adds it.
    pub fn observe(&mut self, value: f64) -> Option<Spike> {
        let spike = self.judge(value);
        if spike.is_none() {
            self.accept(value);
        }
        spike
    }

    /// `(expected, spread)` of the next value from the history (`None` below `min_history`).
    pub fn expectation(&self) -> Option<(f64, f64)> {
        if self.history.len() < self.min_history {
            return None;
        }
        let ys: Vec<f64> = self.history.iter().copied().collect();
        let n = ys.len() as f64;
        let (expected, spread) = match self.score {
            SpikeScore::Mean => {
                let mean = ys.iter().sum::<f64>() / n;
                (mean, (ys.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt())
            }
            SpikeScore::Trend => {
                let (a, b) = theil_sen(&ys);
                let residuals: Vec<f64> = ys.iter().enumerate().map(|(i, y)| y - (a + b * i as f64)).collect();
                // Rising: the line one step on. Falling: the line at the last point, not one step
                // further down — a descent that slows (a loss reaching its plateau) is not a spike.
                (a + b * (n - 1.0) + b.max(0.0), residual_std(&residuals))
            }
        };
        // A floor on the spread: a perfectly flat history must not flag tiny changes.
        Some((expected, spread.max(1e-3 * expected.abs()).max(1e-12)))
    }

    /// Whether `value` is a spike against the history (the history is not changed).
    pub fn judge(&self, value: f64) -> Option<Spike> {
        if !value.is_finite() {
            return Some(Spike { value, expected: f64::NAN, spread: f64::NAN, z: f64::INFINITY });
        }
        let (expected, spread) = self.expectation()?;
        let z = (value - expected) / spread;
        (z > self.threshold).then_some(Spike { value, expected, spread, z })
    }

    /// Drops the newest value of the history (a rewind going back before it).
    pub fn forget_last(&mut self) {
        self.history.pop_back();
    }

    /// Adds `value` to the history (the oldest one leaves a full window).
    pub fn accept(&mut self, value: f64) {
        if self.history.len() == self.window {
            self.history.pop_front();
        }
        self.history.push_back(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn robust_pieces_on_known_data() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&mut []).is_nan());
        // An exact line is recovered; one wild point does not move it.
        let (a, b) = theil_sen(&[5.0, 4.5, 4.0, 3.5, 3.0]);
        assert!((a - 5.0).abs() < 1e-12 && (b + 0.5).abs() < 1e-12);
        let (a, b) = theil_sen(&[5.0, 4.5, 40.0, 3.5, 3.0, 2.5, 2.0]);
        assert!((a - 5.0).abs() < 1e-12 && (b + 0.5).abs() < 1e-12, "{a} {b}");
        // Residuals ±1 of 6 points: sqrt(pi/2) sqrt(6/4).
        let want = (std::f64::consts::PI / 2.0 * 1.5).sqrt();
        assert!((residual_std(&[1.0, -1.0, 1.0, -1.0, 1.0, -1.0]) - want).abs() < 1e-12);
        assert_eq!(residual_std(&[3.0, -3.0]), 0.0);
    }

    #[test]
    fn trend_predicts_the_next_point_of_a_descent() {
        let mut d = SpikeDetector::new(10, 5.0);
        for i in 0..10 {
            assert_eq!(d.observe(10.0 - i as f64 + if i % 2 == 0 { 0.05 } else { -0.05 }), None);
        }
        // Falling: the expectation is the line at the last point (1.0), not one step on.
        let (expected, spread) = d.expectation().unwrap();
        assert!((expected - 1.0).abs() < 0.06, "{expected}");
        assert!(spread > 0.05 && spread < 0.1, "{spread}");
        // 0.0 (on the line) and 1.0 (the descent stopped) are normal; a jump to 2.0 is over 10
        // spreads above — the plain score misses it.
        assert!(d.judge(0.0).is_none() && d.judge(1.05).is_none());
        let s = d.judge(2.0).expect("a jump against a steep descent");
        assert!(s.z > 10.0, "{s:?}");
        // Rising: one step on.
        let mut up = SpikeDetector::new(10, 5.0);
        for i in 0..10 {
            up.observe(i as f64 + if i % 2 == 0 { 0.05 } else { -0.05 });
        }
        assert!((up.expectation().unwrap().0 - 10.0).abs() < 0.06);
        let mut plain = SpikeDetector::with_score(10, 5.0, SpikeScore::Mean);
        for i in 0..10 {
            plain.observe(10.0 - i as f64);
        }
        assert!(plain.judge(2.0).is_none(), "the mean/std score sees nothing unusual");
    }

    #[test]
    fn parse_and_minimum_history() {
        assert_eq!(SpikeScore::parse("trend"), Ok(SpikeScore::Trend));
        assert!(SpikeScore::parse("median").unwrap_err().contains("trend or mean"));
        let mut d = SpikeDetector::new(2, 3.0);
        assert_eq!((d.window, d.min_history), (4, 4));
        for _ in 0..3 {
            assert_eq!(d.observe(1.0), None);
        }
        assert_eq!(d.judge(100.0), None, "three points are too few to judge");
        d.accept(1.0);
        assert!(d.judge(100.0).is_some());
    }
}
