//! The guards on crafted inputs: a NaN planted in one layer's gradient is found there (and not
//! in an earlier parameter), per-layer norms add up to the global norm, a spike stands out of
//! a noisy history while ordinary noise does not, and the skip list survives its round trip.

use megatron_guards::*;

#[test]
fn names_the_first_bad_parameter() {
    let names = [
        "embedding.word_embeddings.weight",
        "decoder.layers.0.mlp.linear_fc1.weight",
        "decoder.layers.1.self_attention.linear_qkv.weight",
        "decoder.layers.1.mlp.linear_fc2.weight",
    ];
    let mut grads: Vec<Vec<f32>> = (0..4).map(|i| vec![0.5 * (i + 1) as f32; 6]).collect();
    let (sq, bad) = first_non_finite(names.iter().copied().zip(grads.iter().map(|g| g.as_slice())));
    assert!(bad.is_none());
    let global: f64 = sq.iter().sum::<f64>().sqrt();
    let per_layer = layer_grad_norms(names.iter().copied().zip(sq.iter().copied()));
    assert_eq!(
        per_layer.iter().map(|(g, _)| g.as_str()).collect::<Vec<_>>(),
        ["embedding.word_embeddings.weight", "layer 0", "layer 1"]
    );
    let back: f64 = per_layer.iter().map(|(_, n)| n * n).sum::<f64>().sqrt();
    assert!((back - global).abs() < 1e-12);

    grads[2][4] = f32::NAN;
    grads[3][0] = f32::INFINITY; // later: not the first
    let (_, bad) = first_non_finite(names.iter().copied().zip(grads.iter().map(|g| g.as_slice())));
    let bad = bad.unwrap();
    assert_eq!((bad.index, bad.layer, bad.non_finite, bad.numel), (2, Some(1), 1, 6));
    assert_eq!(bad.name, names[2]);
}

#[test]
fn spikes_stand_out_of_noise() {
    let mut d = SpikeDetector::new(20, 4.0);
    let mut x = 7u64;
    for i in 0..200 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let noise = ((x >> 33) as f64 / (1u64 << 31) as f64 - 0.5) * 0.2; // ±0.1
        let loss = 5.0 - i as f64 * 0.01 + noise;
        assert_eq!(d.observe(loss), None, "ordinary step {i} flagged");
    }
    let s = d.observe(9.0).expect("a jump of +6 over a ±0.1 history");
    assert!(s.z > 4.0);
    assert!(d.observe(9.0).is_some(), "spikes do not enter the history");
    assert!(d.observe(f64::NAN).is_some());
}

#[test]
fn policies_and_skip_list() {
    assert_eq!(OnNan::parse("rewind"), Ok(OnNan::Rewind));
    assert!(OnNan::parse("retry").unwrap_err().contains("skip, stop or rewind"));
    let mut s = SkipList::default();
    s.add([17, 3, 17]);
    assert_eq!(s.to_json(), "[3,17]");
    let back = SkipList::from_json(&s.to_json()).unwrap();
    assert!(back.contains(3) && back.contains(17) && back.len() == 2);
    assert!(SkipList::from_json("[1,x]").is_err());
}

#[test]
fn skip_list_ranges_and_batches() {
    let mut s = SkipList::default();
    s.add([8, 9, 10, 11, 40, 41]);
    assert_eq!(s.runs(), vec![(8, 12), (40, 42)]);
    assert!(s.any_in(8, 4) && s.any_in(4, 5) && s.any_in(40, 1));
    assert!(!s.any_in(0, 8) && !s.any_in(12, 28) && !s.any_in(42, u64::MAX));
    assert_eq!(s.samples().collect::<Vec<_>>(), vec![8, 9, 10, 11, 40, 41]);
}

/// A loss falling fast (exponential decay to a floor, ±2 % noise): with window 10 the mean/std
/// score takes the descent for noise and misses a jump that doubles the loss, the trend score
/// catches it; over 300 ordinary steps of the same curve neither flags anything.
#[test]
fn trend_score_catches_a_spike_during_a_steep_descent() {
    let curve = |i: usize, x: &mut u64| {
        *x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let noise = ((*x >> 33) as f64 / (1u64 << 31) as f64 - 0.5) * 0.04; // ±2 %
        (0.4 + 9.0 * (-(i as f64) / 8.0).exp()) * (1.0 + noise)
    };
    for score in [SpikeScore::Trend, SpikeScore::Mean] {
        let mut d = SpikeDetector::with_score(10, 5.0, score);
        let mut x = 11u64;
        for i in 0..300 {
            let l = curve(i, &mut x);
            assert_eq!(d.observe(l), None, "{score:?}: ordinary step {i} ({l}) flagged");
        }
    }
    let mut trend = SpikeDetector::with_score(10, 5.0, SpikeScore::Trend);
    let mut mean = SpikeDetector::with_score(10, 5.0, SpikeScore::Mean);
    let mut x = 11u64;
    let mut last = 0.0;
    for i in 0..20 {
        last = curve(i, &mut x);
        trend.observe(last);
        mean.observe(last);
    }
    let jump = 2.0 * last;
    assert!(mean.judge(jump).is_none(), "the plain score was expected to miss it: {:?}", mean.judge(jump));
    let s = trend.judge(jump).expect("trend score misses the spike");
    assert!(s.z > 5.0 && s.expected < last, "{s:?}");
}
