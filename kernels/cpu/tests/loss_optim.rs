//! Embedding, vocab-parallel cross entropy and optimizer steps vs the reference; the cross
//! entropy backward and the embedding backward are also checked by finite differences.

mod common;
use common::*;
use megatron_core::{AdamStep, EmbeddingLossOps, OptimizerOps};
use megatron_cpu::reference as r;

#[test]
fn embedding_matches_reference_with_vocab_slice() {
    let be = backend();
    let mut rng = Rng::new(1);
    let (rows, c, row_start) = (11, 9, 5);
    let ids_v: Vec<i32> = (0..40).map(|_| rng.below(20) as i32).chain([-1, 100]).collect();
    let n = ids_v.len();
    let (table, init, g) = (rng.vec(rows * c, 1.0), rng.vec(n * c, 1.0), rng.vec(n * c, 1.0));
    let (tids, ttab) = (ids(&be, &ids_v), tensor(&be, &table, &[rows, c]));
    for accumulate in [false, true] {
        let mut out = tensor(&be, &init, &[n, c]);
        be.embedding_forward(&tids, &ttab, row_start, &mut out, accumulate).unwrap();
        let mut want = widen(&init);
        r::embedding_forward(&ids_v, &widen(&table), c, row_start, &mut want, accumulate);
        assert_close("embedding forward", &host(&be, &out), &want, 0.0, 1e-6);
    }
    let d0 = rng.vec(rows * c, 1.0);
    let mut dt = tensor(&be, &d0, &[rows, c]);
    be.embedding_backward(&tids, &tensor(&be, &g, &[n, c]), row_start, &mut dt).unwrap();
    let mut want = widen(&d0);
    r::embedding_backward(&ids_v, &widen(&g), c, row_start, &mut want);
    assert_close("embedding backward (accumulates)", &host(&be, &dt), &want, 1e-6, 1e-6);
    // The reference backward is the gradient of Σ g·lookup (finite differences in f64).
    let gw = widen(&g);
    let fd = finite_diff(&widen(&table), 1e-5, |t| {
        let mut o = vec![0.0; n * c];
        r::embedding_forward(&ids_v, t, c, row_start, &mut o, false);
        dot(&o, &gw)
    });
    let mut an = vec![0.0; rows * c];
    r::embedding_backward(&ids_v, &gw, c, row_start, &mut an);
    assert_close64("embedding grad FD", &an, &fd, 1e-8, 1e-8);
    assert!(be.embedding_forward(&ttab, &ttab, 0, &mut zeros(&be, &[rows * c * rows * c]), false).is_err());
}

/// Cross entropy on a vocab slice: stats within 1e-5 rel (polynomial exp, ≤ 4e-7 rel per term),
/// gradients within 1e-6 abs + 1e-4 rel; V = 1031 is odd and wider than a SIMD block.
#[test]
fn cross_entropy_matches_reference_and_finite_differences() {
    let be = backend();
    let mut rng = Rng::new(2);
    let (n, v, vocab_start) = (13, 1031, 100);
    let logits = rng.vec(n * v, 8.0);
    let targets: Vec<i32> = (0..n).map(|i| if i == 3 { 5 } else { (vocab_start + rng.below(v)) as i32 }).collect();
    let d_loss = rng.vec(n, 1.0);
    let tl = tensor(&be, &logits, &[n, v]);
    let tt = ids(&be, &targets);
    let mut mx = zeros(&be, &[n]);
    be.row_max(&tl, &mut mx).unwrap();
    let wl = widen(&logits);
    let wmx = r::row_max(&wl, v);
    assert_close("row_max", &host(&be, &mx), &wmx, 0.0, 0.0);
    let (mut se, mut tlg) = (zeros(&be, &[n]), zeros(&be, &[n]));
    be.cross_entropy_stats(&tl, &tt, vocab_start, &mx, &mut se, &mut tlg).unwrap();
    let (wse, wtl) = r::cross_entropy_stats(&wl, &targets, v, vocab_start, &wmx);
    assert_close("sum_exp", &host(&be, &se), &wse, 0.0, 1e-5);
    assert_close("target_logit (0 when not owned)", &host(&be, &tlg), &wtl, 1e-6, 1e-6);
    let mut d = tensor(&be, &logits, &[n, v]);
    be.cross_entropy_backward_inplace(&mut d, &tt, vocab_start, &mx, &se, &tensor(&be, &d_loss, &[n])).unwrap();
    let want = r::cross_entropy_backward(&wl, &targets, v, vocab_start, &wmx, &wse, &widen(&d_loss));
    assert_close("cross entropy backward", &host(&be, &d), &want, 1e-6, 1e-4);
    // Reference backward (single rank, vocab_start 0) vs FD of the full loss.
    let (n, v) = (3, 7);
    let (l, dl) = (widen(&rng.vec(n * v, 3.0)), widen(&rng.vec(n, 1.0)));
    let t: Vec<i32> = vec![0, 6, 3];
    let m = r::row_max(&l, v);
    let (s, _) = r::cross_entropy_stats(&l, &t, v, 0, &m);
    let an = r::cross_entropy_backward(&l, &t, v, 0, &m, &s, &dl);
    let fd = finite_diff(&l, 1e-5, |l| r::cross_entropy_loss(l, &t, v, &dl));
    assert_close64("cross entropy grad FD", &an, &fd, 1e-8, 1e-6);
}

/// Optimizer steps: a few iterations of fp32 vs f64 agree to 1e-6 abs + 1e-5 rel.
#[test]
fn adam_and_sgd_match_reference() {
    let be = backend();
    let mut rng = Rng::new(3);
    let n = 20_003;
    let p0 = rng.vec(n, 1.0);
    let (mut p, mut m, mut v) = (tensor(&be, &p0, &[n]), zeros(&be, &[n]), zeros(&be, &[n]));
    let (mut wp, mut wm, mut wv) = (widen(&p0), vec![0.0; n], vec![0.0; n]);
    for step in 1..=3 {
        let g = rng.vec(n, 0.1);
        let s = AdamStep { lr: 1e-2, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, step };
        be.adam_step(&mut p, &tensor(&be, &g, &[n]), &mut m, &mut v, s).unwrap();
        r::adam_step(&mut wp, &widen(&g), &mut wm, &mut wv, s);
    }
    assert_close("adam param", &host(&be, &p), &wp, 1e-6, 1e-5);
    assert_close("adam exp_avg_sq", &host(&be, &v), &wv, 1e-9, 1e-5);
    let bad = AdamStep { lr: 1e-2, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.0, step: 0 };
    assert!(be.adam_step(&mut p, &zeros(&be, &[n]), &mut m, &mut v, bad).is_err());

    let (mut p, mut buf) = (tensor(&be, &p0, &[n]), zeros(&be, &[n]));
    let (mut wp, mut wbuf) = (widen(&p0), vec![0.0; n]);
    for first in [true, false, false] {
        let g = rng.vec(n, 0.1);
        be.sgd_step(&mut p, &tensor(&be, &g, &[n]), &mut buf, 0.1, 0.9, 0.01, first).unwrap();
        r::sgd_step(&mut wp, &widen(&g), &mut wbuf, 0.1, 0.9, 0.01, first);
    }
    assert_close("sgd param", &host(&be, &p), &wp, 1e-6, 1e-5);
    assert!(be.sgd_step(&mut p, &zeros(&be, &[3]), &mut buf, 0.1, 0.9, 0.0, true).is_err());
}
