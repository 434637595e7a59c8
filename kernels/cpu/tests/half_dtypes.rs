//! bf16/fp16 parity of every op against the f64 reference (the dtype rules of
//! `megatron_core::Backend`): inputs are rounded to the half dtype first and the reference runs
//! on those rounded values, so the checks measure the kernel's f32 arithmetic plus the single
//! rounding of each output.
//!
//! Tolerances (`|got − want| ≤ atol + rtol·|want|`) add the op's fp32 tolerance (as in the
//! fp32 parity tests) and one output rounding of the dtype:
//! * bf16 output: + (1e-4 abs, 4e-3 rel) — 8 significant bits, half an ulp is 2^-9 relative;
//! * fp16 output: + (1e-5 abs, 5e-4 rel) — 11 significant bits, half an ulp is 2^-12 relative
//!   (plus 6e-8 abs for fp16's subnormals);
//! * fp32 output (mixed-dtype calls): the fp32 tolerance alone.

mod common;
use common::{assert_close, Rng};
use megatron_core::half::{bf16, f16};
use megatron_core::{
    ActivationOps, AdamStep, AttentionOps, AttentionSpec, DType, DeviceTensor, ElementwiseOps, EmbeddingLossOps,
    GemmOps, GemmSpec, HostBuffer, KvCacheOps, MemoryOps, NormOps, OptimizerOps, RotaryOps, RotarySpec,
};
use megatron_cpu::reference as r;
use megatron_cpu::CpuBackend;

const HALVES: [DType; 2] = [DType::BF16, DType::F16];

/// `x` rounded to `dt` and back (what a tensor of `dt` stores).
fn round(dt: DType, x: f32) -> f32 {
    match dt {
        DType::BF16 => bf16::from_f32(x).to_f32(),
        DType::F16 => f16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// A tensor of `dt` holding `data` rounded, and the rounded values widened to f64.
fn make(be: &CpuBackend, dt: DType, data: &[f32], shape: &[usize]) -> (DeviceTensor, Vec<f64>) {
    let buf = match dt {
        DType::BF16 => HostBuffer::BF16(data.iter().map(|&x| bf16::from_f32(x)).collect()),
        DType::F16 => HostBuffer::F16(data.iter().map(|&x| f16::from_f32(x)).collect()),
        _ => HostBuffer::F32(data.to_vec()),
    };
    let want = data.iter().map(|&x| round(dt, x) as f64).collect();
    (be.from_host(buf, shape).expect("test tensor"), want)
}

fn zeros(be: &CpuBackend, dt: DType, shape: &[usize]) -> DeviceTensor {
    be.zeros(shape, dt).expect("zeros")
}

/// Values of a tensor, which must have dtype `dt` (outputs keep the caller's dtype).
fn read(be: &CpuBackend, t: &DeviceTensor, dt: DType) -> Vec<f32> {
    assert_eq!(t.dtype(), dt, "output dtype");
    be.to_host(t).expect("to_host").to_f32_vec()
}

/// The op's fp32 tolerance widened by one rounding to `dt` (see the module docs).
fn tol(dt: DType, atol: f64, rtol: f64) -> (f64, f64) {
    match dt {
        DType::BF16 => (atol + 1e-4, rtol + 4e-3),
        DType::F16 => (atol + 1e-5, rtol + 5e-4),
        _ => (atol, rtol),
    }
}

fn check(what: &str, dt: DType, got: &[f32], want: &[f64], atol: f64, rtol: f64) {
    let (a, r) = tol(dt, atol, rtol);
    assert_close(&format!("{what} [{dt}]"), got, want, a, r);
}

/// Every transpose variant, with/without bias and beta, odd sizes and K > the packing block
/// (several K blocks accumulate in f32), C in the half dtype or in fp32, both kernels.
/// fp32 part: the f32 accumulation error of K products of |x| ≤ 1, bounded by 2e-6·K abs.
#[test]
fn gemm_half_all_variants_match_reference() {
    let mut rng = Rng::new(11);
    for fallback in [false, true] {
        let be =
            if fallback { CpuBackend::new().force_bf16_fallback(true) } else { CpuBackend::new().force_bf16_dot(true) };
        for dt in HALVES {
            for &(m, n, k) in &[(1, 1, 1), (7, 13, 5), (33, 50, 37), (19, 97, 801), (4, 4, 0), (130, 49, 8)] {
                for trans_a in [false, true] {
                    for trans_b in [false, true] {
                        for (alpha, beta, with_bias, c_dt) in [
                            (1.0, 0.0, false, dt),
                            (0.5, 1.0, true, dt),
                            (-2.0, 0.25, false, DType::F32),
                            (1.0, 1.0, true, DType::F32),
                        ] {
                            let (ta, a) = make(&be, dt, &rng.vec(m * k, 1.0), &[m * k]);
                            let (tb, b) = make(&be, dt, &rng.vec(k * n, 1.0), &[k * n]);
                            let (mut tc, mut want) = make(&be, c_dt, &rng.vec(m * n, 1.0), &[m, n]);
                            let (tbias, bias) = make(&be, dt, &rng.vec(n, 1.0), &[n]);
                            let spec = GemmSpec { m, n, k, trans_a, trans_b, alpha, beta };
                            be.gemm(&ta, &tb, &mut tc, spec, with_bias.then_some(&tbias)).unwrap();
                            let bias = with_bias.then_some(&bias[..]);
                            r::gemm(m, n, k, &a, trans_a, &b, trans_b, alpha as f64, beta as f64, &mut want, bias);
                            let what = format!("gemm {spec:?} bias={with_bias} C={c_dt} fallback={fallback}");
                            check(&what, c_dt, &read(&be, &tc, c_dt), &want, 1e-5 + 2e-6 * k as f64, 1e-5);
                        }
                    }
                }
            }
        }
    }
}

/// fp16 and mixed operand dtypes (fp32 × bf16, bf16 × fp16) take the widened-f32 kernel.
#[test]
fn gemm_mixed_operand_dtypes() {
    let be = CpuBackend::new();
    let mut rng = Rng::new(12);
    let (m, n, k) = (21, 35, 70);
    for (a_dt, b_dt, c_dt) in [
        (DType::F32, DType::BF16, DType::F32),
        (DType::BF16, DType::F16, DType::BF16),
        (DType::F32, DType::F32, DType::F16),
    ] {
        let (ta, a) = make(&be, a_dt, &rng.vec(m * k, 1.0), &[m, k]);
        let (tb, b) = make(&be, b_dt, &rng.vec(n * k, 1.0), &[n, k]);
        let mut tc = zeros(&be, c_dt, &[m, n]);
        be.gemm(&ta, &tb, &mut tc, GemmSpec::linear(m, n, k), None).unwrap();
        let mut want = vec![0.0; m * n];
        r::gemm(m, n, k, &a, false, &b, true, 1.0, 0.0, &mut want, None);
        check(&format!("gemm {a_dt}x{b_dt}"), c_dt, &read(&be, &tc, c_dt), &want, 1e-4, 1e-5);
    }
    // Integer operands are still rejected with the op and argument named.
    let ids = be.from_host(HostBuffer::I32(vec![1; m * k]), &[m, k]).unwrap();
    let (tb, _) = make(&be, DType::BF16, &rng.vec(n * k, 1.0), &[n, k]);
    let mut tc = zeros(&be, DType::F32, &[m, n]);
    let e = be.gemm(&ids, &tb, &mut tc, GemmSpec::linear(m, n, k), None).unwrap_err().to_string();
    assert!(e.contains("gemm") && e.contains("`a`") && e.contains("int32"), "{e}");
}

/// The AVX512-BF16 kernel (forced on) equals the widened-f32 fallback within the f32 accumulation
/// tolerance, and both are bit-identical across thread counts (K is never split).
#[test]
fn bf16_gemm_dot_kernel_equals_fallback_and_ignores_thread_count() {
    let mut rng = Rng::new(13);
    let (m, n, k) = (300, 200, 1000); // several row blocks, column ranges and K blocks
    let a = rng.vec(m * k, 1.0);
    let b = rng.vec(n * k, 1.0);
    let run = |be: &CpuBackend| {
        let (ta, _) = make(be, DType::BF16, &a, &[m, k]);
        let (tb, _) = make(be, DType::BF16, &b, &[n, k]);
        let mut c = zeros(be, DType::F32, &[m, n]);
        be.gemm(&ta, &tb, &mut c, GemmSpec::linear(m, n, k), None).unwrap();
        read(be, &c, DType::F32)
    };
    let fallback = CpuBackend::new().force_bf16_fallback(true);
    assert_eq!(fallback.bf16_gemm_kernel(), "f32-fma");
    // The default is a fixed per-CPU choice.
    let default = if megatron_cpu::default_bf16_dot() { "avx512bf16" } else { "f32-fma" };
    assert_eq!(CpuBackend::new().force_bf16_dot(false).bf16_gemm_kernel(), default);
    let base_fb = run(&fallback);
    for threads in [1, 2, 3] {
        let be = CpuBackend::with_threads(threads).unwrap().force_bf16_dot(true);
        let got = run(&be);
        let fb = run(&CpuBackend::with_threads(threads).unwrap().force_bf16_fallback(true));
        assert!(fb == base_fb, "fallback result changed with {threads} threads");
        if megatron_cpu::bf16_dot_supported() {
            assert_eq!(be.bf16_gemm_kernel(), "avx512bf16");
        } else {
            eprintln!("skipping the AVX512-BF16 half of this test: the CPU has no avx512bf16");
        }
        let base = run(&CpuBackend::with_threads(1).unwrap().force_bf16_dot(true));
        assert!(got == base, "{} result changed with {threads} threads", be.bf16_gemm_kernel());
        let want: Vec<f64> = base_fb.iter().map(|&x| x as f64).collect();
        assert_close("dot kernel vs fallback", &got, &want, 2e-6 * k as f64, 1e-5);
    }
}

#[test]
fn elementwise_half() {
    let be = CpuBackend::new();
    let mut rng = Rng::new(14);
    let n = 40_001;
    for dt in HALVES {
        let (ta, a) = make(&be, dt, &rng.vec(n, 3.0), &[n]);
        let (tb, b) = make(&be, dt, &rng.vec(n, 3.0), &[n]);
        let mut out = zeros(&be, dt, &[n]);
        be.add(&ta, &tb, &mut out).unwrap();
        let sum: Vec<f64> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        check("add", dt, &read(&be, &out, dt), &sum, 1e-6, 1e-6);
        // Mixed: the fp32 residual stream plus a half branch.
        let mut out32 = zeros(&be, DType::F32, &[n]);
        be.add(&ta, &tb, &mut out32).unwrap();
        check("add into fp32", DType::F32, &read(&be, &out32, DType::F32), &sum, 1e-6, 1e-6);
        let (mut acc, acc0) = make(&be, dt, &rng.vec(n, 1.0), &[n]);
        be.axpy(&mut acc, -0.5, &tb).unwrap();
        let want: Vec<f64> = acc0.iter().zip(&b).map(|(x, y)| x - 0.5 * y).collect();
        check("axpy", dt, &read(&be, &acc, dt), &want, 1e-6, 1e-6);
        let mut s = make(&be, dt, &rng.vec(n, 1.0), &[n]);
        be.scale(&mut s.0, 3.0).unwrap();
        let want: Vec<f64> = s.1.iter().map(|x| 3.0 * x).collect();
        check("scale", dt, &read(&be, &s.0, dt), &want, 1e-6, 1e-6);
        be.fill(&mut s.0, 2.5).unwrap();
        assert!(read(&be, &s.0, dt).iter().all(|&v| v == 2.5));
        let ss: f64 = a.iter().map(|x| x * x).sum();
        assert!((be.sum_squares(&ta).unwrap() - ss).abs() < 1e-9 * ss, "sum_squares [{dt}]");
        let mx = a.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        assert_eq!(be.abs_max(&ta).unwrap(), (mx as f32, false), "abs_max [{dt}]");
        let (rows, c) = (101, 37);
        let (tx, x) = make(&be, dt, &rng.vec(rows * c, 1.0), &[rows, c]);
        let (mut tacc, mut want) = make(&be, dt, &rng.vec(c, 1.0), &[c]);
        be.sum_rows(&tx, &mut tacc).unwrap();
        r::sum_rows(&x, c, &mut want);
        check("sum_rows", dt, &read(&be, &tacc, dt), &want, 1e-5, 1e-5);
        // Half rows are widened piece by piece (exact): an fp32 bias gradient gets the same bits
        // as from an fp32 copy of the same values (several pieces: 600 rows of 37).
        let (rows, xs) = (600, rng.vec(600 * c, 1.0));
        let (tx, xw) = make(&be, dt, &xs, &[rows, c]);
        let tx32 = be.from_host(HostBuffer::F32(xw.iter().map(|&v| v as f32).collect()), &[rows, c]).unwrap();
        let (mut g16, mut g32) = (zeros(&be, DType::F32, &[c]), zeros(&be, DType::F32, &[c]));
        be.sum_rows(&tx, &mut g16).unwrap();
        be.sum_rows(&tx32, &mut g32).unwrap();
        assert_eq!(read(&be, &g16, DType::F32), read(&be, &g32, DType::F32), "sum_rows [{dt}] vs fp32 copy");
        let (mut td, mut want) = make(&be, dt, &rng.vec(n, 1.0), &[n]);
        be.dropout(&mut td, 0.25, 5).unwrap();
        r::dropout(&mut want, 0.25, 5);
        check("dropout", dt, &read(&be, &td, dt), &want, 1e-6, 1e-6);
    }
    // fp16 overflow: 70000 rounds to +inf in fp16, and abs_max reports it.
    let (t, _) = make(&be, DType::F16, &[1.0, 70_000.0], &[2]);
    assert!(be.abs_max(&t).unwrap().1);
}

/// Norms: outputs in the half dtype, mean/rstd in fp32; statistics of another dtype are refused.
#[test]
fn norms_half() {
    let be = CpuBackend::new();
    let mut rng = Rng::new(15);
    let (rows, c, eps) = (67, 48, 1e-5f32);
    for dt in HALVES {
        let (tx, x) = make(&be, dt, &rng.vec(rows * c, 2.0), &[rows, c]);
        let (tw, w) = make(&be, dt, &rng.vec(c, 1.0), &[c]);
        let (tbias, bias) = make(&be, dt, &rng.vec(c, 1.0), &[c]);
        let (tg, g) = make(&be, dt, &rng.vec(rows * c, 1.0), &[rows, c]);
        let mut out = zeros(&be, dt, &[rows, c]);
        let (mut mean, mut rstd) = (zeros(&be, DType::F32, &[rows]), zeros(&be, DType::F32, &[rows]));
        be.layernorm_forward(&tx, &tw, Some(&tbias), eps, &mut out, &mut mean, &mut rstd).unwrap();
        let (wo, wm, wr) = r::layernorm_forward(&x, &w, Some(&bias), eps as f64, c);
        check("layernorm out", dt, &read(&be, &out, dt), &wo, 1e-5, 1e-5);
        check("layernorm mean", DType::F32, &read(&be, &mean, DType::F32), &wm, 1e-5, 1e-5);
        check("layernorm rstd", DType::F32, &read(&be, &rstd, DType::F32), &wr, 1e-5, 1e-5);
        let mut dx = zeros(&be, dt, &[rows, c]);
        let (mut dw, mut db) = (zeros(&be, DType::F32, &[c]), zeros(&be, dt, &[c]));
        be.layernorm_backward(&tg, &tx, &tw, &mean, &rstd, &mut dx, &mut dw, Some(&mut db)).unwrap();
        let (wdx, wdw, wdb) = r::layernorm_backward(&g, &x, &w, eps as f64, c);
        check("layernorm d_x", dt, &read(&be, &dx, dt), &wdx, 1e-4, 1e-4);
        check("layernorm d_weight (fp32)", DType::F32, &read(&be, &dw, DType::F32), &wdw, 1e-4, 1e-4);
        check("layernorm d_bias", dt, &read(&be, &db, dt), &wdb, 1e-4, 1e-4);

        let mut rs = zeros(&be, DType::F32, &[rows]);
        be.rmsnorm_forward(&tx, &tw, eps, &mut out, &mut rs).unwrap();
        let (wo, wr) = r::rmsnorm_forward(&x, &w, eps as f64, c);
        check("rmsnorm out", dt, &read(&be, &out, dt), &wo, 1e-5, 1e-5);
        check("rmsnorm rstd", DType::F32, &read(&be, &rs, DType::F32), &wr, 1e-5, 1e-5);
        let mut dw = zeros(&be, dt, &[c]);
        be.rmsnorm_backward(&tg, &tx, &tw, &rs, &mut dx, &mut dw).unwrap();
        let (wdx, wdw) = r::rmsnorm_backward(&g, &x, &w, eps as f64, c);
        check("rmsnorm d_x", dt, &read(&be, &dx, dt), &wdx, 1e-4, 1e-4);
        check("rmsnorm d_weight", dt, &read(&be, &dw, dt), &wdw, 1e-4, 1e-4);

        let mut half_stat = zeros(&be, dt, &[rows]);
        let e = be.rmsnorm_forward(&tx, &tw, eps, &mut out, &mut half_stat).unwrap_err().to_string();
        assert!(e.contains("rstd") && e.contains(&dt.to_string()), "{e}");
    }
}

#[test]
fn activations_half() {
    let be = CpuBackend::new();
    let mut rng = Rng::new(16);
    let (rows, f) = (33, 40);
    for dt in HALVES {
        let (tx, x) = make(&be, dt, &rng.vec(rows * f, 4.0), &[rows, f]);
        let (tg, g) = make(&be, dt, &rng.vec(rows * f, 1.0), &[rows, f]);
        let mut out = zeros(&be, dt, &[rows, f]);
        be.gelu_forward(&tx, &mut out).unwrap();
        let want: Vec<f64> = x.iter().map(|&v| r::gelu(v)).collect();
        check("gelu", dt, &read(&be, &out, dt), &want, 1e-6, 1e-5);
        be.gelu_backward(&tx, &tg, &mut out).unwrap();
        let want: Vec<f64> = x.iter().zip(&g).map(|(&v, &d)| d * r::gelu_grad(v)).collect();
        check("gelu backward", dt, &read(&be, &out, dt), &want, 1e-6, 1e-5);

        let mut y = zeros(&be, dt, &[rows, f]);
        be.softmax_forward(&tx, &mut y).unwrap();
        let want = r::softmax_forward(&x, f);
        check("softmax", dt, &read(&be, &y, dt), &want, 1e-6, 1e-5);
        // The backward reads the stored (rounded) probabilities.
        let yv: Vec<f64> = read(&be, &y, dt).iter().map(|&v| v as f64).collect();
        be.softmax_backward(&y, &tg, &mut out).unwrap();
        check("softmax backward", dt, &read(&be, &out, dt), &r::softmax_backward(&yv, &g, f), 1e-6, 1e-5);

        let (tx2, x2) = make(&be, dt, &rng.vec(rows * 2 * f, 3.0), &[rows, 2 * f]);
        be.swiglu_forward(&tx2, &mut out).unwrap();
        check("swiglu", dt, &read(&be, &out, dt), &r::swiglu_forward(&x2, f), 1e-6, 1e-5);
        let mut dx2 = zeros(&be, dt, &[rows, 2 * f]);
        be.swiglu_backward(&tx2, &tg, &mut dx2).unwrap();
        check("swiglu backward", dt, &read(&be, &dx2, dt), &r::swiglu_backward(&x2, &g, f), 1e-6, 1e-5);
    }
}

/// Attention with half qkv/out/d_qkv and an fp32 lse through the widened fp32 kernel (bf16 on
/// an AVX512-BF16 CPU takes the `vdpbf16ps` kernel by default: tested in `attention_bf16`);
/// rotary in place on half qkv.
#[test]
fn attention_and_rotary_half() {
    let be = CpuBackend::new().force_bf16_fallback(true);
    let mut rng = Rng::new(17);
    let s = AttentionSpec {
        batch: 2,
        seq: 70,
        heads: 2,
        head_dim: 16,
        causal: true,
        scale: 0.25,
        dropout_p: 0.1,
        dropout_seed: 9,
    };
    let shape = [s.batch, s.seq, s.heads, 3, s.head_dim];
    let n_out = s.batch * s.seq * s.heads * s.head_dim;
    for dt in HALVES {
        let (tq, q) = make(&be, dt, &rng.vec(shape.iter().product(), 1.5), &shape);
        let mut out = zeros(&be, dt, &[s.batch, s.seq, s.heads * s.head_dim]);
        let mut lse = zeros(&be, DType::F32, &[s.batch, s.heads, s.seq]);
        be.attention_forward(&tq, &mut out, &mut lse, s).unwrap();
        let (wo, wl) = r::attention_forward(&q, &s);
        check("attention out", dt, &read(&be, &out, dt), &wo, 2e-5, 1e-4);
        check("attention lse", DType::F32, &read(&be, &lse, DType::F32), &wl, 2e-5, 1e-4);
        let (tg, g) = make(&be, dt, &rng.vec(n_out, 1.0), &[s.batch, s.seq, s.heads * s.head_dim]);
        let mut dq = zeros(&be, dt, &shape);
        be.attention_backward(&tg, &tq, &out, &lse, &mut dq, s).unwrap();
        // The backward's D_i uses the stored (rounded) output: allow the bf16/fp16 rounding of
        // `out` to propagate (|Δout| ≤ rtol·|out|, times |dO| ≤ 1, summed over head_dim).
        let (a, rt) = tol(dt, 1e-4, 1e-3);
        let prop = rt * s.head_dim as f64;
        assert_close(
            &format!("attention d_qkv [{dt}]"),
            &read(&be, &dq, dt),
            &r::attention_backward(&g, &q, &s),
            a + prop,
            rt,
        );

        let rs = RotarySpec {
            batch: s.batch,
            seq: s.seq,
            heads: s.heads,
            head_dim: s.head_dim,
            rotary_dim: 8,
            base: 10000.0,
            interleaved: false,
            position_offset: 3,
        };
        let (mut tr, mut want) = make(&be, dt, &rng.vec(shape.iter().product(), 1.0), &shape);
        be.rotary(&mut tr, rs, false).unwrap();
        r::rotary(&mut want, &rs, false);
        check("rotary", dt, &read(&be, &tr, dt), &want, 1e-5, 1e-5);
    }
}

#[test]
fn embedding_and_loss_half() {
    let be = CpuBackend::new();
    let mut rng = Rng::new(18);
    let (rows, c, v, n) = (50, 24, 97, 61);
    let idv: Vec<i32> = (0..n).map(|_| rng.below(rows + 10) as i32).collect();
    let ids = be.from_host(HostBuffer::I32(idv.clone()), &[n]).unwrap();
    for dt in HALVES {
        let (table, tv) = make(&be, dt, &rng.vec(rows * c, 1.0), &[rows, c]);
        let (mut out, mut want) = make(&be, dt, &rng.vec(n * c, 1.0), &[n, c]);
        be.embedding_forward(&ids, &table, 5, &mut out, true).unwrap();
        r::embedding_forward(&idv, &tv, c, 5, &mut want, true);
        check("embedding forward (accumulate)", dt, &read(&be, &out, dt), &want, 1e-6, 1e-6);
        let (d_out, g) = make(&be, dt, &rng.vec(n * c, 1.0), &[n, c]);
        let mut dt32 = zeros(&be, DType::F32, &[rows, c]);
        be.embedding_backward(&ids, &d_out, 5, &mut dt32).unwrap();
        let mut want = vec![0.0; rows * c];
        r::embedding_backward(&idv, &g, c, 5, &mut want);
        check("embedding backward (fp32 grads)", DType::F32, &read(&be, &dt32, DType::F32), &want, 1e-5, 1e-5);

        let targets: Vec<i32> = (0..n).map(|_| rng.below(v) as i32).collect();
        let tt = be.from_host(HostBuffer::I32(targets.clone()), &[n]).unwrap();
        let (mut logits, l) = make(&be, dt, &rng.vec(n * v, 4.0), &[n, v]);
        let f32z = |be: &CpuBackend| zeros(be, DType::F32, &[n]);
        let (mut mx, mut se, mut tl) = (f32z(&be), f32z(&be), f32z(&be));
        be.row_max(&logits, &mut mx).unwrap();
        let wm = r::row_max(&l, v);
        check("row_max", DType::F32, &read(&be, &mx, DType::F32), &wm, 0.0, 0.0);
        be.cross_entropy_stats(&logits, &tt, 0, &mx, &mut se, &mut tl).unwrap();
        let (wse, wtl) = r::cross_entropy_stats(&l, &targets, v, 0, &wm);
        check("sum_exp", DType::F32, &read(&be, &se, DType::F32), &wse, 1e-5, 1e-5);
        check("target_logit", DType::F32, &read(&be, &tl, DType::F32), &wtl, 1e-6, 1e-6);
        let (d_loss, dl) = make(&be, DType::F32, &rng.vec(n, 1.0), &[n]);
        be.cross_entropy_backward_inplace(&mut logits, &tt, 0, &mx, &se, &d_loss).unwrap();
        let want = r::cross_entropy_backward(&l, &targets, v, 0, &wm, &wse, &dl);
        check("cross entropy backward", dt, &read(&be, &logits, dt), &want, 1e-6, 1e-5);
    }
}

/// Optimizer steps on half tensors (compute in f32, round the updated values once).
#[test]
fn optimizers_half() {
    let be = CpuBackend::new();
    let mut rng = Rng::new(19);
    let n = 5000;
    let step = AdamStep { lr: 1e-2, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, step: 3 };
    for dt in HALVES {
        let (mut p, mut wp) = make(&be, dt, &rng.vec(n, 1.0), &[n]);
        let (g, wg) = make(&be, dt, &rng.vec(n, 1.0), &[n]);
        let (mut m, mut wm) = make(&be, DType::F32, &rng.vec(n, 0.1), &[n]);
        let (mut v, mut wv) = make(&be, DType::F32, &rng.vec(n, 0.1).iter().map(|x| x * x).collect::<Vec<_>>(), &[n]);
        be.adam_step(&mut p, &g, &mut m, &mut v, step).unwrap();
        r::adam_step(&mut wp, &wg, &mut wm, &mut wv, step);
        check("adam param", dt, &read(&be, &p, dt), &wp, 1e-6, 1e-5);
        check("adam exp_avg", DType::F32, &read(&be, &m, DType::F32), &wm, 1e-6, 1e-5);
        let (mut buf, mut wb) = make(&be, dt, &rng.vec(n, 1.0), &[n]);
        let (mut p2, mut wp2) = make(&be, dt, &rng.vec(n, 1.0), &[n]);
        be.sgd_step(&mut p2, &g, &mut buf, 0.1, 0.9, 0.01, false).unwrap();
        r::sgd_step(&mut wp2, &wg, &mut wb, 0.1, 0.9, 0.01, false);
        check("sgd param", dt, &read(&be, &p2, dt), &wp2, 1e-6, 1e-5);
        check("sgd buffer", dt, &read(&be, &buf, dt), &wb, 1e-6, 1e-5);
    }
}

/// Incremental decoding on half qkv and half caches: the new k/v are copied exactly (a copy of
/// half values is exact), the output is rounded once.
#[test]
fn kv_cache_attention_half() {
    let be = CpuBackend::new();
    let mut rng = Rng::new(20);
    let s = megatron_core::KvCacheAttentionSpec {
        batch: 2,
        new_tokens: 3,
        heads: 2,
        head_dim: 16,
        capacity: 9,
        offset: 4,
        scale: 0.25,
    };
    let cache = [s.batch, s.capacity, s.heads, s.head_dim];
    let n_cache: usize = cache.iter().product();
    for dt in HALVES {
        let (qkv, x) = make(
            &be,
            dt,
            &rng.vec(s.batch * s.new_tokens * s.heads * 3 * s.head_dim, 1.5),
            &[s.batch, s.new_tokens, s.heads, 3, s.head_dim],
        );
        let (mut k, k0) = make(&be, dt, &rng.vec(n_cache, 1.0), &cache);
        let (mut v, v0) = make(&be, dt, &rng.vec(n_cache, 1.0), &cache);
        let mut out = zeros(&be, dt, &[s.batch, s.new_tokens, s.heads * s.head_dim]);
        let starts = be.from_host(HostBuffer::I32(vec![0, 2]), &[2]).unwrap();
        be.attention_kv_cache(&qkv, &mut k, &mut v, Some(&starts), &mut out, s).unwrap();
        let (want, wk, wv) = r::attention_kv_cache(&x, &k0, &v0, &[0, 2], &s);
        check("kv attention out", dt, &read(&be, &out, dt), &want, 1e-5, 1e-4);
        assert_close(&format!("k cache [{dt}]"), &read(&be, &k, dt), &wk, 0.0, 0.0);
        assert_close(&format!("v cache [{dt}]"), &read(&be, &v, dt), &wv, 0.0, 0.0);
    }
}
