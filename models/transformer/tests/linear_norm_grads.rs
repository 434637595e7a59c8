//! Backward of the parallel linears and the norms against finite differences through the
//! CPU backend (tp = 1), with a `Σ out·R` probe loss.

mod common;

use common::*;
use megatron_core::Param;
use megatron_transformer::grad_check::{check_params, spread_indices, worst};
use megatron_transformer::{
    ColumnParallelLinear, LayerNorm, LinearConfig, LinearLayer, NormLayer, RmsNorm, RowParallelLinear,
};

const N: usize = 5;

fn cfg(in_features: usize, out_features: usize) -> LinearConfig {
    LinearConfig { in_features, out_features, bias: true, init_std: 0.5, out_chunks: 1 }
}

/// Runs forward + backward once, then checks every parameter and the input gradient.
fn check_linear(mut layer: Box<dyn LinearLayer>, fin: usize, fout: usize) {
    let b = backend();
    let bk = b.as_ref();
    let xv = random_vec(N * fin, 1, 1.0);
    let r = random_vec(N * fout, 2, 1.0);
    let x = tensor(bk, xv.clone(), &[N, fin]);
    let mut out = zeros(bk, &[N, fout]);
    let mut d_x = zeros(bk, &[N, fin]);
    layer.forward(&x, &mut out).unwrap();
    // Bias grads must accumulate: run backward twice and compare against 2x the FD.
    let r_t = tensor(bk, r.clone(), &[N, fout]);
    layer.backward(&x, &r_t, Some(&mut d_x)).unwrap();
    layer.backward(&x, &r_t, Some(&mut d_x)).unwrap();

    fn params(m: &mut Box<dyn LinearLayer>) -> Vec<&mut Param> {
        m.params_mut()
    }
    let mut loss = |m: &mut Box<dyn LinearLayer>| {
        let mut out = zeros(bk, &[N, fout]);
        m.forward(&x, &mut out)?;
        Ok(2.0 * probe(bk, &out, &r))
    };
    let samples = check_params(&mut layer, bk, params, &|_| true, &mut loss, 6, 1e-2, 1e-3).unwrap();
    let w = worst(&samples).unwrap();
    assert!(w.rel_err < 1e-3, "worst parameter gradient: {w:?}");
    assert!(samples.iter().any(|s| s.param.ends_with("bias")));

    let idx = spread_indices(xv.len(), 8);
    let numeric = fd_input(&xv, &idx, 1e-2, |v| {
        let x = tensor(bk, v.to_vec(), &[N, fin]);
        let mut out = zeros(bk, &[N, fout]);
        layer.forward(&x, &mut out).unwrap();
        probe(bk, &out, &r)
    });
    let dx = host(bk, &d_x);
    let analytic: Vec<f64> = idx.iter().map(|&i| dx[i] as f64).collect();
    assert_close("d_x", &analytic, &numeric, 1e-3, 1e-3);
}

#[test]
fn column_parallel_linear_backward_matches_finite_differences() {
    let b = builder(3);
    check_linear(Box::new(ColumnParallelLinear::new(&b, "col", cfg(6, 8)).unwrap()), 6, 8);
}

#[test]
fn row_parallel_linear_backward_matches_finite_differences() {
    let b = builder(4);
    check_linear(Box::new(RowParallelLinear::new(&b, "row", cfg(8, 6)).unwrap()), 8, 6);
}

#[test]
fn linear_names_layouts_and_forward_match_a_naive_matmul() {
    let b = builder(5);
    let bk = b.backend.as_ref();
    let mut col = ColumnParallelLinear::new(&b, "decoder.x", cfg(3, 4)).unwrap();
    assert_eq!(col.weight.name, "decoder.x.weight");
    assert_eq!(col.weight.layout.tp_axis, Some(0));
    assert!(!col.weight.layout.no_weight_decay);
    let bias = col.bias.as_ref().unwrap();
    assert!(bias.layout.no_weight_decay);
    let row = RowParallelLinear::new(&b, "decoder.y", cfg(4, 3)).unwrap();
    assert_eq!(row.weight.layout.tp_axis, Some(1));
    assert_eq!(row.bias.as_ref().unwrap().layout.tp_axis, None);

    let bv = random_vec(4, 9, 1.0);
    col.bias.as_mut().unwrap().value = tensor(bk, bv.clone(), &[4]);
    let xv = random_vec(2 * 3, 8, 1.0);
    let mut out = zeros(bk, &[2, 4]);
    col.forward(&tensor(bk, xv.clone(), &[2, 3]), &mut out).unwrap();
    let w = host(bk, &col.weight.value);
    let got = host(bk, &out);
    for r in 0..2 {
        for o in 0..4 {
            let want: f32 = (0..3).map(|i| xv[r * 3 + i] * w[o * 3 + i]).sum::<f32>() + bv[o];
            assert!((got[r * 4 + o] - want).abs() < 1e-5, "out[{r},{o}] {} vs {want}", got[r * 4 + o]);
        }
    }
}

fn check_norm(mut norm: Box<dyn NormLayer>, c: usize) {
    let b = backend();
    let bk = b.as_ref();
    // Non-trivial weights and bias so their gradients and the input gradient all matter.
    for (k, p) in norm.params_mut().into_iter().enumerate() {
        let v = random_vec(c, 20 + k as u64, 0.5).iter().map(|x| x + 1.0).collect();
        p.value = tensor(bk, v, &[c]);
    }
    let xv = random_vec(N * c, 11, 2.0);
    let r = random_vec(N * c, 12, 1.0);
    let x = tensor(bk, xv.clone(), &[N, c]);
    let mut out = zeros(bk, &[N, c]);
    let mut d_x = zeros(bk, &[N, c]);
    norm.forward(&x, &mut out).unwrap();
    norm.backward(&tensor(bk, r.clone(), &[N, c]), &x, &mut d_x).unwrap();

    fn params(m: &mut Box<dyn NormLayer>) -> Vec<&mut Param> {
        m.params_mut()
    }
    let mut loss = |m: &mut Box<dyn NormLayer>| {
        let mut out = zeros(bk, &[N, c]);
        m.forward(&x, &mut out)?;
        Ok(probe(bk, &out, &r))
    };
    let samples = check_params(&mut norm, bk, params, &|_| true, &mut loss, 5, 1e-2, 1e-2).unwrap();
    let w = worst(&samples).unwrap();
    assert!(w.rel_err < 5e-3, "worst norm parameter gradient: {w:?}");

    let idx = spread_indices(xv.len(), 10);
    let numeric = fd_input(&xv, &idx, 1e-2, |v| {
        let x = tensor(bk, v.to_vec(), &[N, c]);
        let mut out = zeros(bk, &[N, c]);
        norm.forward(&x, &mut out).unwrap();
        probe(bk, &out, &r)
    });
    let dx = host(bk, &d_x);
    let analytic: Vec<f64> = idx.iter().map(|&i| dx[i] as f64).collect();
    // Second-order FD error with eps = 1e-2 on inputs of size ~1: well under 1%.
    assert_close("norm d_x", &analytic, &numeric, 1e-2, 1e-2);
}

#[test]
fn layernorm_backward_matches_finite_differences() {
    let b = builder(6);
    check_norm(Box::new(LayerNorm::new(&b, "ln", 7, 1e-5).unwrap()), 7);
}

#[test]
fn rmsnorm_backward_matches_finite_differences() {
    let b = builder(7);
    check_norm(Box::new(RmsNorm::new(&b, "rms", 7, 1e-5).unwrap()), 7);
}
