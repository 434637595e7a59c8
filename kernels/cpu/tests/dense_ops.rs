//! Parity of gemm and the elementwise/reduction ops against the reference, plus dtype,
//! shape and cast behaviour of the memory ops.

mod common;
use common::*;
use megatron_core::{ActivationOps, DType, ElementwiseOps, GemmOps, GemmSpec, HostBuffer, MemoryOps};
use megatron_cpu::reference as r;

/// gemm vs the f64 triple loop for every transpose combination, with/without bias and beta,
/// odd sizes. Tolerance: k ≤ 37 products of |x| ≤ 1 → 1e-5 abs + 1e-5 rel.
#[test]
fn gemm_all_variants_match_reference() {
    let be = backend();
    let mut rng = Rng::new(1);
    // m = 9001 > 2 x 4096 takes the row-blocked path of a transposed A (with a partial block).
    for &(m, n, k) in &[(1, 1, 1), (7, 13, 5), (33, 17, 37), (65, 3, 9), (4, 4, 0), (9001, 3, 4)] {
        for trans_a in [false, true] {
            for trans_b in [false, true] {
                for (alpha, beta, with_bias) in
                    [(1.0, 0.0, false), (0.5, 1.0, true), (-2.0, 0.25, false), (1.0, 0.0, true)]
                {
                    let a = rng.vec(m * k, 1.0);
                    let b = rng.vec(k * n, 1.0);
                    let c0 = rng.vec(m * n, 1.0);
                    let bias = rng.vec(n, 1.0);
                    let (ta, tb) = (tensor(&be, &a, &[m * k]), tensor(&be, &b, &[k * n]));
                    let mut tc = tensor(&be, &c0, &[m, n]);
                    let tbias = tensor(&be, &bias, &[n]);
                    let spec = GemmSpec { m, n, k, trans_a, trans_b, alpha, beta };
                    be.gemm(&ta, &tb, &mut tc, spec, with_bias.then_some(&tbias)).unwrap();
                    let mut want = widen(&c0);
                    let wb = widen(&bias);
                    r::gemm(
                        m,
                        n,
                        k,
                        &widen(&a),
                        trans_a,
                        &widen(&b),
                        trans_b,
                        alpha as f64,
                        beta as f64,
                        &mut want,
                        with_bias.then_some(&wb[..]),
                    );
                    assert_close(&format!("gemm {spec:?} bias={with_bias}"), &host(&be, &tc), &want, 1e-5, 1e-5);
                }
            }
        }
    }
}

#[test]
fn gemm_beta_zero_ignores_nan_in_c_and_checks_shapes() {
    let be = backend();
    let a = tensor(&be, &[1.0, 2.0], &[1, 2]);
    let b = tensor(&be, &[3.0, 4.0], &[2, 1]);
    let mut c = tensor(&be, &[f32::NAN], &[1, 1]);
    be.gemm(&a, &b, &mut c, GemmSpec { m: 1, n: 1, k: 2, trans_a: false, trans_b: false, alpha: 1.0, beta: 0.0 }, None)
        .unwrap();
    assert_eq!(host(&be, &c), vec![11.0]);
    let e = be.gemm(&a, &b, &mut c, GemmSpec::linear(1, 2, 2), None).unwrap_err().to_string();
    assert!(e.contains("gemm") && e.contains("`b`"), "{e}");
    let h = be.zeros(&[2], DType::U8).unwrap();
    let e = be.gemm(&h, &b, &mut c, GemmSpec::linear(1, 1, 2), None).unwrap_err().to_string();
    assert!(e.contains("uint8") && e.contains("gemm") && e.contains("cpu"), "{e}");
}

/// Elementwise ops are exact in fp32 up to one rounding: 1e-6 abs + 1e-6 rel.
#[test]
fn elementwise_ops_match_reference() {
    let be = backend();
    let mut rng = Rng::new(2);
    let n = 50_001; // several rayon chunks and a ragged tail
    let (a, b) = (rng.vec(n, 3.0), rng.vec(n, 3.0));
    let ta = tensor(&be, &a, &[n]);
    let tb = tensor(&be, &b, &[n]);
    let mut out = zeros(&be, &[n]);
    be.add(&ta, &tb, &mut out).unwrap();
    let want: Vec<f64> = a.iter().zip(&b).map(|(&x, &y)| x as f64 + y as f64).collect();
    assert_close("add", &host(&be, &out), &want, 1e-6, 1e-6);
    be.axpy(&mut out, -0.5, &tb).unwrap();
    let want: Vec<f64> = want.iter().zip(&b).map(|(&x, &y)| x - 0.5 * y as f64).collect();
    assert_close("axpy", &host(&be, &out), &want, 1e-6, 1e-6);
    be.scale(&mut out, 3.0).unwrap();
    let want: Vec<f64> = want.iter().map(|x| 3.0 * x).collect();
    assert_close("scale", &host(&be, &out), &want, 1e-5, 1e-6);
    be.fill(&mut out, 2.5).unwrap();
    assert!(host(&be, &out).iter().all(|&v| v == 2.5));

    let ss: f64 = a.iter().map(|&v| v as f64 * v as f64).sum();
    assert!((be.sum_squares(&ta).unwrap() - ss).abs() < 1e-9 * ss);
    let mx = a.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
    assert_eq!(be.abs_max(&ta).unwrap(), (mx, false));
    let mut inf = a.clone();
    inf[777] = f32::INFINITY;
    assert!(be.abs_max(&tensor(&be, &inf, &[n])).unwrap().1);

    let (rows, c) = (101, 37);
    let x = rng.vec(rows * c, 1.0);
    let init = rng.vec(c, 1.0);
    let mut acc = tensor(&be, &init, &[c]);
    be.sum_rows(&tensor(&be, &x, &[rows, c]), &mut acc).unwrap();
    let mut want = widen(&init);
    r::sum_rows(&widen(&x), c, &mut want);
    assert_close("sum_rows (accumulates)", &host(&be, &acc), &want, 1e-5, 1e-5);
}

/// Dropout equals the reference mask exactly (same counter-based stream), keeps ~1-p, and
/// applying it to a gradient with the same seed reproduces the mask.
#[test]
fn dropout_matches_reference_mask() {
    let be = backend();
    let mut rng = Rng::new(3);
    let n = 40_000;
    let x = rng.vec(n, 1.0);
    for p in [0.0f32, 0.1, 0.5] {
        let mut t = tensor(&be, &x, &[n]);
        be.dropout(&mut t, p, 99).unwrap();
        let mut want = widen(&x);
        r::dropout(&mut want, p, 99);
        assert_close(&format!("dropout p={p}"), &host(&be, &t), &want, 1e-6, 1e-6);
        let kept = want.iter().filter(|&&v| v != 0.0).count() as f64 / n as f64;
        assert!((kept - (1.0 - p as f64)).abs() < 0.02, "kept {kept} for p={p}");
    }
    assert!(be.dropout(&mut zeros(&be, &[3]), 1.0, 0).is_err());
}

#[test]
fn memory_ops_handle_every_dtype() {
    let be = backend();
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8, DType::U16] {
        let z = be.zeros(&[2, 3], dtype).unwrap();
        assert_eq!((z.shape(), z.dtype()), (&[2usize, 3][..], dtype));
        let mut dst = be.zeros(&[2, 3], dtype).unwrap();
        be.copy(&z, &mut dst).unwrap();
        assert_eq!(be.to_host(&dst).unwrap(), HostBuffer::zeros(dtype, 6));
    }
    let src = be.from_host(HostBuffer::I32(vec![1, -2, 3]), &[3]).unwrap();
    let mut f = zeros(&be, &[3]);
    be.cast(&src, &mut f).unwrap();
    assert_eq!(host(&be, &f), vec![1.0, -2.0, 3.0]);
    let mut h = be.zeros(&[3], DType::BF16).unwrap();
    be.cast(&f, &mut h).unwrap();
    // Half tensors compute in f32 and round back (tests/half_dtypes.rs); integers are refused.
    be.scale(&mut h, 2.0).unwrap();
    assert_eq!(host(&be, &h), vec![2.0, -4.0, 6.0]);
    let mut i = be.zeros(&[3], DType::I32).unwrap();
    let e = be.scale(&mut i, 2.0).unwrap_err().to_string();
    assert!(e.contains("scale") && e.contains("int32"), "{e}");
    assert!(be.from_host(HostBuffer::F32(vec![1.0; 5]), &[2, 3]).is_err());
}

#[test]
fn plugin_is_registered_and_config_is_checked() {
    let reg = megatron_core::Registry::builtin().unwrap();
    let be = reg.backend("cpu", megatron_core::serde_json::json!({})).unwrap();
    assert_eq!(be.name(), "cpu");
    let be2 = reg.backend("cpu", megatron_core::serde_json::json!({"threads": 1})).unwrap();
    let t = be2.from_host(HostBuffer::F32(vec![1.0; 4]), &[4]).unwrap();
    assert_eq!(be2.sum_squares(&t).unwrap(), 4.0);
    let e = reg.backend("cpu", megatron_core::serde_json::json!({"thread": 1})).err().unwrap().to_string();
    assert!(e.contains("thread") && e.contains("cpu"), "{e}");
    assert!(reg.backend("cpu", megatron_core::serde_json::json!({"threads": 0})).is_err());
}
