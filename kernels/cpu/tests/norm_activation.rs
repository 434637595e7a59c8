//! Norms and activations: kernel vs f64 reference (forward and backward) and reference
//! backward vs central finite differences of the reference forward.

mod common;
use common::*;
use megatron_core::{ActivationOps, NormOps};
use megatron_cpu::reference as r;

const EPS: f32 = 1e-5;

/// LayerNorm with/without bias: forward 1e-5 abs + 1e-4 rel; backward 1e-4 abs + 1e-3 rel
/// (x of scale 2, C = 77 with a ragged SIMD tail, N = 70 rows > one parallel task).
#[test]
fn layernorm_matches_reference_and_finite_differences() {
    let be = backend();
    let mut rng = Rng::new(1);
    let (n, c) = (70, 77);
    for with_bias in [true, false] {
        let (x, w, b, g) = (rng.vec(n * c, 2.0), rng.vec(c, 1.0), rng.vec(c, 1.0), rng.vec(n * c, 1.0));
        let (tx, tw, tb) = (tensor(&be, &x, &[n, c]), tensor(&be, &w, &[c]), tensor(&be, &b, &[c]));
        let (mut out, mut mean, mut rstd) = (zeros(&be, &[n, c]), zeros(&be, &[n]), zeros(&be, &[n]));
        be.layernorm_forward(&tx, &tw, with_bias.then_some(&tb), EPS, &mut out, &mut mean, &mut rstd).unwrap();
        let wb = widen(&b);
        let (want, wmean, wrstd) =
            r::layernorm_forward(&widen(&x), &widen(&w), with_bias.then_some(&wb[..]), EPS as f64, c);
        assert_close("layernorm out", &host(&be, &out), &want, 1e-5, 1e-4);
        assert_close("layernorm mean", &host(&be, &mean), &wmean, 1e-6, 1e-5);
        assert_close("layernorm rstd", &host(&be, &rstd), &wrstd, 1e-6, 1e-5);

        let (mut dx, mut dw, mut db) = (zeros(&be, &[n, c]), tensor(&be, &vec![1.0; c], &[c]), zeros(&be, &[c]));
        be.layernorm_backward(&tensor(&be, &g, &[n, c]), &tx, &tw, &mean, &rstd, &mut dx, &mut dw, Some(&mut db))
            .unwrap();
        let (wdx, wdw, wdb) = r::layernorm_backward(&widen(&g), &widen(&x), &widen(&w), EPS as f64, c);
        assert_close("layernorm d_x", &host(&be, &dx), &wdx, 1e-4, 1e-3);
        let wdw1: Vec<f64> = wdw.iter().map(|v| v + 1.0).collect(); // d_weight accumulates onto 1
        assert_close("layernorm d_weight", &host(&be, &dw), &wdw1, 1e-4, 1e-3);
        assert_close("layernorm d_bias", &host(&be, &db), &wdb, 1e-4, 1e-3);
    }
    // Finite differences (f64, h=1e-5) of Σ g·LN(x; w, b) in x, w and b.
    let (n, c) = (3, 5);
    let (x, w, b, g) =
        (widen(&rng.vec(n * c, 2.0)), widen(&rng.vec(c, 1.0)), widen(&rng.vec(c, 1.0)), widen(&rng.vec(n * c, 1.0)));
    let (dx, dw, db) = r::layernorm_backward(&g, &x, &w, 1e-5, c);
    let f = |x: &[f64], w: &[f64], b: &[f64]| dot(&r::layernorm_forward(x, w, Some(b), 1e-5, c).0, &g);
    assert_close64("layernorm dx FD", &dx, &finite_diff(&x, 1e-5, |x| f(x, &w, &b)), 1e-7, 1e-6);
    assert_close64("layernorm dw FD", &dw, &finite_diff(&w, 1e-5, |w| f(&x, w, &b)), 1e-7, 1e-6);
    assert_close64("layernorm db FD", &db, &finite_diff(&b, 1e-5, |b| f(&x, &w, b)), 1e-7, 1e-6);
}

#[test]
fn rmsnorm_matches_reference_and_finite_differences() {
    let be = backend();
    let mut rng = Rng::new(2);
    let (n, c) = (45, 33);
    let (x, w, g) = (rng.vec(n * c, 2.0), rng.vec(c, 1.0), rng.vec(n * c, 1.0));
    let (tx, tw) = (tensor(&be, &x, &[n, c]), tensor(&be, &w, &[c]));
    let (mut out, mut rstd) = (zeros(&be, &[n, c]), zeros(&be, &[n]));
    be.rmsnorm_forward(&tx, &tw, EPS, &mut out, &mut rstd).unwrap();
    let (want, wrstd) = r::rmsnorm_forward(&widen(&x), &widen(&w), EPS as f64, c);
    assert_close("rmsnorm out", &host(&be, &out), &want, 1e-5, 1e-4);
    assert_close("rmsnorm rstd", &host(&be, &rstd), &wrstd, 1e-6, 1e-5);
    let (mut dx, mut dw) = (zeros(&be, &[n, c]), zeros(&be, &[c]));
    be.rmsnorm_backward(&tensor(&be, &g, &[n, c]), &tx, &tw, &rstd, &mut dx, &mut dw).unwrap();
    let (wdx, wdw) = r::rmsnorm_backward(&widen(&g), &widen(&x), &widen(&w), EPS as f64, c);
    assert_close("rmsnorm d_x", &host(&be, &dx), &wdx, 1e-4, 1e-3);
    assert_close("rmsnorm d_weight", &host(&be, &dw), &wdw, 1e-4, 1e-3);

    let (x, w, g) = (widen(&rng.vec(12, 2.0)), widen(&rng.vec(4, 1.0)), widen(&rng.vec(12, 1.0)));
    let (dx, dw) = r::rmsnorm_backward(&g, &x, &w, 1e-5, 4);
    assert_close64(
        "rmsnorm dx FD",
        &dx,
        &finite_diff(&x, 1e-5, |x| dot(&r::rmsnorm_forward(x, &w, 1e-5, 4).0, &g)),
        1e-7,
        1e-6,
    );
    assert_close64(
        "rmsnorm dw FD",
        &dw,
        &finite_diff(&w, 1e-5, |w| dot(&r::rmsnorm_forward(&x, w, 1e-5, 4).0, &g)),
        1e-7,
        1e-6,
    );
}

/// GeLU uses a polynomial tanh (|error| ≤ 3e-7): forward/backward within 2e-6 abs + 1e-5 rel of
/// the f64 formula over x in [-8, 8].
#[test]
fn gelu_matches_reference_and_finite_differences() {
    let be = backend();
    let mut rng = Rng::new(3);
    let n = 30_011;
    let (x, g) = (rng.vec(n, 8.0), rng.vec(n, 1.0));
    let tx = tensor(&be, &x, &[n]);
    let mut out = zeros(&be, &[n]);
    be.gelu_forward(&tx, &mut out).unwrap();
    let want: Vec<f64> = x.iter().map(|&v| r::gelu(v as f64)).collect();
    assert_close("gelu", &host(&be, &out), &want, 2e-6, 1e-5);
    let mut dx = zeros(&be, &[n]);
    be.gelu_backward(&tx, &tensor(&be, &g, &[n]), &mut dx).unwrap();
    let want: Vec<f64> = x.iter().zip(&g).map(|(&v, &g)| r::gelu_grad(v as f64) * g as f64).collect();
    assert_close("gelu backward", &host(&be, &dx), &want, 2e-6, 1e-5);
    let xs = widen(&rng.vec(20, 4.0));
    let fd = finite_diff(&xs, 1e-5, |x| x.iter().map(|&v| r::gelu(v)).sum());
    let an: Vec<f64> = xs.iter().map(|&v| r::gelu_grad(v)).collect();
    assert_close64("gelu grad FD", &an, &fd, 1e-8, 1e-7);
}

#[test]
fn swiglu_matches_reference_and_finite_differences() {
    let be = backend();
    let mut rng = Rng::new(4);
    let (n, f) = (37, 23);
    let (x, g) = (rng.vec(n * 2 * f, 6.0), rng.vec(n * f, 1.0));
    let tx = tensor(&be, &x, &[n, 2 * f]);
    let mut out = zeros(&be, &[n, f]);
    be.swiglu_forward(&tx, &mut out).unwrap();
    assert_close("swiglu", &host(&be, &out), &r::swiglu_forward(&widen(&x), f), 2e-6, 1e-5);
    let mut dx = zeros(&be, &[n, 2 * f]);
    be.swiglu_backward(&tx, &tensor(&be, &g, &[n, f]), &mut dx).unwrap();
    assert_close("swiglu backward", &host(&be, &dx), &r::swiglu_backward(&widen(&x), &widen(&g), f), 2e-6, 1e-5);
    let (xs, gs) = (widen(&rng.vec(3 * 8, 4.0)), widen(&rng.vec(3 * 4, 1.0)));
    let fd = finite_diff(&xs, 1e-5, |x| dot(&r::swiglu_forward(x, 4), &gs));
    assert_close64("swiglu grad FD", &r::swiglu_backward(&xs, &gs, 4), &fd, 1e-8, 1e-7);
    assert!(be.swiglu_forward(&tensor(&be, &[1.0; 3], &[1, 3]), &mut zeros(&be, &[1])).is_err());
}

#[test]
fn softmax_matches_reference_and_finite_differences() {
    let be = backend();
    let mut rng = Rng::new(5);
    let (n, c) = (19, 131);
    let (x, g) = (rng.vec(n * c, 10.0), rng.vec(n * c, 1.0));
    let tx = tensor(&be, &x, &[n, c]);
    let mut y = zeros(&be, &[n, c]);
    be.softmax_forward(&tx, &mut y).unwrap();
    let wy = r::softmax_forward(&widen(&x), c);
    assert_close("softmax", &host(&be, &y), &wy, 1e-7, 1e-5);
    let mut dx = zeros(&be, &[n, c]);
    be.softmax_backward(&y, &tensor(&be, &g, &[n, c]), &mut dx).unwrap();
    assert_close("softmax backward", &host(&be, &dx), &r::softmax_backward(&wy, &widen(&g), c), 1e-6, 1e-4);
    let (xs, gs) = (widen(&rng.vec(2 * 6, 3.0)), widen(&rng.vec(2 * 6, 1.0)));
    let fd = finite_diff(&xs, 1e-5, |x| dot(&r::softmax_forward(x, 6), &gs));
    let an = r::softmax_backward(&r::softmax_forward(&xs, 6), &gs, 6);
    assert_close64("softmax grad FD", &an, &fd, 1e-8, 1e-6);
}
