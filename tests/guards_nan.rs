//! Training guards end to end: a NaN injected into one layer's gradient at a chosen iteration
//! and microbatch (`--inject-nan-grad`, test only) is named — parameter, layer, microbatch,
//! sample indices — and `--on-nan` behaves: `skip` goes on with that step skipped, `stop`
//! ends the run with the diagnosis. `--log-per-layer-grad-norms` runs alongside.

mod common;

use common::*;

const PARAM: &str = "decoder.layers.1.mlp.linear_fc2.weight";

#[test]
fn stop_names_layer_microbatch_and_samples() {
    // Iteration 3's global batch starts at sample 8 (4 per iteration); microbatch 1 of 2 at
    // micro batch 2 covers samples 10..12.
    let f = tiny_with(&format!("--train-iters 4 --on-nan stop --inject-nan-grad 3:1:{PARAM}"));
    let err = format!("{:#}", pretrain(&f).unwrap_err());
    assert!(err.contains("iteration 3") && err.contains(&format!("`{PARAM}` (layer 1, 1 of")), "{err}");
    assert!(err.contains("microbatch 1 reproduces it alone (samples 10..12"), "{err}");
    assert!(err.contains("--on-nan stop"), "{err}");
}

#[test]
fn skip_goes_on_and_counts_the_skipped_step() {
    let f = tiny_with(&format!(
        "--train-iters 4 --log-per-layer-grad-norms --log-interval 1 --inject-nan-grad 2:0:{PARAM}"
    ));
    let s = pretrain(&f).unwrap();
    assert_eq!(s.final_iteration, 4);
    let bad: Vec<u64> = s.grad_norms.iter().filter(|(_, n)| !n.is_finite()).map(|(i, _)| *i).collect();
    assert_eq!(bad, vec![2], "{:?}", s.grad_norms);
    assert!(s.losses.iter().all(|(_, l)| l.is_finite()));
}
