//! `megatron-guards`: the checks a training driver runs after every backward pass (issue 19),
//! as plain functions over host data so the driver's hook stays a few lines.
//!
//! * [`first_non_finite`]: in model order, the first parameter whose gradient holds a NaN or
//!   an infinity, with its layer and how many elements are bad (one pass over the grads; the
//!   per-parameter squared norms it returns are the ones the global grad norm needs anyway).
//! * [`layer_grad_norms`]: per-layer gradient norms (`decoder.layers.N` grouped), for
//!   `--log-per-layer-grad-norms`.
//! * [`SpikeDetector`]: z-score of the loss or grad norm against a window of recent values
//!   (`--spike-threshold`): by default the residual from a robust linear trend in robust
//!   standard deviations, so a spike during a steep descent stands out ([`detector`]).
//! * [`OnNan`] and [`SkipList`]: the `skip | stop | rewind` policy and the sample indices a
//!   rewound run must skip (serialized into the checkpoint so a resumed run skips them too).
//! * [`SpikeGuards`]: the loss and grad-norm detectors of one run together, judging an
//!   iteration before its update (a spike is kept out of both histories).

pub mod detector;
mod spikes;

pub use detector::{Spike, SpikeDetector, SpikeScore};
pub use spikes::{SpikeGuards, SpikeVerdict};
use std::collections::BTreeSet;

/// The first parameter (in model order) with a non-finite gradient.
#[derive(Clone, Debug, PartialEq)]
pub struct BadGrad {
    pub index: usize,
    pub name: String,
    /// `N` of `decoder.layers.N.`, `None` for embeddings, final norm and output layer.
    pub layer: Option<usize>,
    pub non_finite: usize,
    pub numel: usize,
}

/// `N` of a parameter named `decoder.layers.N.…`.
pub fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("decoder.layers.")?.split('.').next()?.parse().ok()
}

/// Squared L2 norm of every gradient (f64, fixed order) and the first non-finite one.
pub fn first_non_finite<'a>(grads: impl IntoIterator<Item = (&'a str, &'a [f32])>) -> (Vec<f64>, Option<BadGrad>) {
    let mut sq = Vec::new();
    let mut bad = None;
    for (i, (name, g)) in grads.into_iter().enumerate() {
        let s: f64 = g.iter().map(|&x| x as f64 * x as f64).sum();
        if bad.is_none() && !s.is_finite() {
            let non_finite = g.iter().filter(|x| !x.is_finite()).count();
            bad = Some(BadGrad { index: i, name: name.to_string(), layer: layer_of(name), non_finite, numel: g.len() });
        }
        sq.push(s);
    }
    (sq, bad)
}

/// `(group, norm)` per layer in first-seen order: every `decoder.layers.N.*` parameter joins
/// group `layer N`; the others are their own group.
pub fn layer_grad_norms<'a>(names_and_sq: impl IntoIterator<Item = (&'a str, f64)>) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = Vec::new();
    for (name, sq) in names_and_sq {
        let group = layer_of(name).map_or_else(|| name.to_string(), |l| format!("layer {l}"));
        match out.iter_mut().find(|(g, _)| *g == group) {
            Some((_, acc)) => *acc += sq,
            None => out.push((group, sq)),
        }
    }
    out.into_iter().map(|(g, s)| (g, s.sqrt())).collect()
}

/// What to do on a non-finite value or a spike (`--on-nan`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnNan {
    /// Drop this iteration's update and go on.
    Skip,
    /// Stop training with the diagnosis.
    Stop,
    /// Reload the last checkpoint and skip the offending samples from then on.
    Rewind,
}

impl OnNan {
    pub fn parse(s: &str) -> Result<OnNan, String> {
        match s {
            "skip" => Ok(OnNan::Skip),
            "stop" => Ok(OnNan::Stop),
            "rewind" => Ok(OnNan::Rewind),
            other => Err(format!("--on-nan `{other}`: expected skip, stop or rewind")),
        }
    }
}

/// Dataset sample indices a run must never train on again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SkipList {
    samples: BTreeSet<u64>,
}

impl SkipList {
    pub fn add(&mut self, samples: impl IntoIterator<Item = u64>) {
        self.samples.extend(samples);
    }

    pub fn contains(&self, sample: u64) -> bool {
        self.samples.contains(&sample)
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Whether any of the samples `start..start + len` is listed (a global batch is skipped
    /// whole when one of its samples is).
    pub fn any_in(&self, start: u64, len: u64) -> bool {
        self.samples.range(start..start.saturating_add(len)).next().is_some()
    }

    /// The listed samples in increasing order.
    pub fn samples(&self) -> impl Iterator<Item = u64> + '_ {
        self.samples.iter().copied()
    }

    /// The listed samples as half-open runs `[(start, end)]`, for messages.
    pub fn runs(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for &s in &self.samples {
            match out.last_mut() {
                Some((_, end)) if *end == s => *end += 1,
                _ => out.push((s, s + 1)),
            }
        }
        out
    }

    /// `"[3,17]"`: the form stored in the checkpoint metadata.
    pub fn to_json(&self) -> String {
        let items: Vec<String> = self.samples.iter().map(u64::to_string).collect();
        format!("[{}]", items.join(","))
    }

    pub fn from_json(s: &str) -> Result<SkipList, String> {
        let inner = s.trim().strip_prefix('[').and_then(|r| r.strip_suffix(']')).ok_or("skip list: expected [..]")?;
        let mut out = SkipList::default();
        for part in inner.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            out.samples.insert(part.parse().map_err(|_| format!("skip list: `{part}` is not a sample index"))?);
        }
        Ok(out)
    }
}
