//! The CPU backend's fast Mamba-2 kernels (`megatron-cpu`, `mamba/`: vectorised loops, the
//! scan's intra-chunk products as small GEMMs, parallel over batch × heads) against the naive
//! references of [`megatron_hybrid::ops`]: the SSD scan against the scalar chunked scan and
//! the sequential recurrence (forward, saved states and all six gradients) for chunk sizes
//! and lengths that are not multiples of the chunk, the causal conv1d + SiLU and the gated
//! RMSNorm (forward and every gradient). Tolerances (f32, other summation orders, the
//! polynomial `exp`): forward 2e-5 and gradients 1e-4 of the tensor's largest magnitude for
//! the scan; 1e-5 for conv and norm. And one vs two threads: bit-identical.

use megatron_core::{
    Backend, Conv1dSpec, DType, DeviceTensor, HostBuffer, MambaOps, MemoryOps, SsdGradTensors, SsdTensors,
};
use megatron_cpu::CpuBackend;
use megatron_hybrid::ops::conv::{conv_silu_backward, conv_silu_forward, conv_silu_reference};
use megatron_hybrid::ops::gated_norm::{gated_rmsnorm_backward, gated_rmsnorm_forward};
use megatron_hybrid::ops::ssd::{ssd_backward, ssd_forward, SsdInputs};
use megatron_hybrid::ops::ssd_ref::{ssd_reference_backward, ssd_reference_forward};
use megatron_hybrid::ops::SsdDims;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn uniform(seed: u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(lo..hi)).collect()
}

fn t(be: &dyn Backend, v: &[f32]) -> DeviceTensor {
    be.from_host(HostBuffer::F32(v.to_vec()), &[v.len()]).unwrap()
}

fn z(be: &dyn Backend, n: usize) -> DeviceTensor {
    be.zeros(&[n], DType::F32).unwrap()
}

fn host(be: &dyn Backend, t: &DeviceTensor) -> Vec<f32> {
    be.to_host(t).unwrap().to_f32_vec()
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-6);
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// Inputs of one scan: `[x, dt, a, b, c, d, dy]`.
fn scan_data(s: &SsdDims, seed: u64) -> [Vec<f32>; 7] {
    let rows = s.batch * s.seq;
    let xn = rows * s.heads * s.head_dim;
    let bn = rows * s.groups * s.state;
    [
        uniform(seed, xn, -1.0, 1.0),
        uniform(seed + 1, rows * s.heads, 0.01, 0.6),
        uniform(seed + 2, s.heads, -3.0, -0.3),
        uniform(seed + 3, bn, -1.0, 1.0),
        uniform(seed + 4, bn, -1.0, 1.0),
        uniform(seed + 5, s.heads, 0.5, 1.5),
        uniform(seed + 6, xn, -1.0, 1.0),
    ]
}

/// The backend scan: `y`, `states` and the gradients `[x, dt, a, b, c, d]`.
fn backend_scan(be: &dyn Backend, s: &SsdDims, v: &[Vec<f32>; 7]) -> (Vec<f32>, Vec<f32>, Vec<Vec<f32>>) {
    let ts: Vec<DeviceTensor> = v.iter().map(|x| t(be, x)).collect();
    let inputs = SsdTensors { x: &ts[0], dt: &ts[1], a: &ts[2], b: &ts[3], c: &ts[4], d: &ts[5] };
    let (mut y, mut states) = (z(be, v[0].len()), z(be, s.states_len()));
    be.ssd_scan_forward(inputs, &mut y, &mut states, *s).unwrap();
    let mut g: Vec<DeviceTensor> = v[..6].iter().map(|x| z(be, x.len())).collect();
    let [gx, gdt, ga, gb, gc, gd] = &mut g[..] else { unreachable!() };
    let grads = SsdGradTensors { x: gx, dt: gdt, a: ga, b: gb, c: gc, d: gd };
    be.ssd_scan_backward(inputs, &states, &ts[6], grads, *s).unwrap();
    (host(be, &y), host(be, &states), g.iter().map(|x| host(be, x)).collect())
}

const NAMES: [&str; 6] = ["x", "dt", "A", "B", "C", "D"];

#[test]
fn fast_scan_matches_the_naive_chunked_scan_and_the_recurrence() {
    let be = CpuBackend::new();
    // (seq, chunk, head_dim, state, heads, groups): ragged last chunks, one chunk longer than
    // the sequence, head/state widths that hit the 64-, 16- and 1-wide GEMM blocks.
    let cases = [
        (1, 4, 3, 5, 4, 2),
        (7, 4, 3, 5, 4, 2),
        (13, 5, 17, 5, 4, 1),
        (33, 8, 3, 5, 4, 2),
        (40, 64, 8, 4, 2, 2),
        (150, 64, 64, 32, 2, 1),
    ];
    for (seq, chunk, head_dim, state, heads, groups) in cases {
        let s = SsdDims { batch: 2, seq, heads, head_dim, groups, state, chunk };
        let v = scan_data(&s, (seq * 100 + chunk) as u64);
        let (y, states, g) = backend_scan(&be, &s, &v);
        let naive = SsdInputs { x: &v[0], dt: &v[1], a: &v[2], bm: &v[3], cm: &v[4], d: &v[5] };
        let (y_n, states_n) = ssd_forward(&s, &naive).unwrap();
        let y_ref = ssd_reference_forward(&s, &naive).unwrap();
        let (e_n, e_ref, e_s) = (max_rel(&y, &y_n), max_rel(&y, &y_ref), max_rel(&states, &states_n));
        eprintln!("seq {seq} chunk {chunk} P {head_dim} N {state}: y vs naive {e_n:.1e}, vs recurrence {e_ref:.1e}, states {e_s:.1e}");
        assert!(e_n < 2e-5 && e_ref < 2e-5 && e_s < 2e-5, "forward seq {seq} chunk {chunk}: {e_n} {e_ref} {e_s}");
        let g_n = ssd_backward(&s, &naive, &states_n, &v[6]).unwrap();
        let g_ref = ssd_reference_backward(&s, &naive, &v[6]).unwrap();
        let want_n = [&g_n.x, &g_n.dt, &g_n.a, &g_n.bm, &g_n.cm, &g_n.d];
        let want_ref = [&g_ref.x, &g_ref.dt, &g_ref.a, &g_ref.bm, &g_ref.cm, &g_ref.d];
        let mut worst = (0.0f32, 0.0f32);
        for k in 0..6 {
            let (e_n, e_ref) = (max_rel(&g[k], want_n[k]), max_rel(&g[k], want_ref[k]));
            worst = (worst.0.max(e_n), worst.1.max(e_ref));
            assert!(e_n < 1e-4 && e_ref < 1e-4, "d{} seq {seq} chunk {chunk}: {e_n:.1e} {e_ref:.1e}", NAMES[k]);
        }
        eprintln!("  worst gradient vs naive {:.1e}, vs recurrence {:.1e}", worst.0, worst.1);
    }
}

#[test]
fn fast_conv_matches_the_naive_conv() {
    let be = CpuBackend::new();
    // 2 x 70 rows: blocks of 64 rows straddle the batch boundary
    for (seq, ch, k) in [(70usize, 19usize, 4usize), (5, 8, 4), (9, 3, 1)] {
        let s = Conv1dSpec { batch: 2, seq, channels: ch, width: k };
        let n = 2 * seq * ch;
        let (x, w, b, g) = (
            uniform(1, n, -1.0, 1.0),
            uniform(2, ch * k, -0.5, 0.5),
            uniform(3, ch, -0.5, 0.5),
            uniform(4, n, -1.0, 1.0),
        );
        let (mut out, mut pre) = (z(&be, n), z(&be, n));
        be.causal_conv1d_silu_forward(&t(&be, &x), &t(&be, &w), &t(&be, &b), &mut out, &mut pre, s).unwrap();
        let (out_n, pre_n) = conv_silu_forward(&s, &x, &w, &b).unwrap();
        let out_ref = conv_silu_reference(&s, &x, &w, &b);
        assert!(max_rel(&host(&be, &out), &out_n) < 1e-5, "conv out seq {seq}");
        assert!(max_rel(&host(&be, &out), &out_ref) < 1e-5, "conv out vs reference seq {seq}");
        assert!(max_rel(&host(&be, &pre), &pre_n) < 1e-5, "conv pre seq {seq}");
        // d_weight / d_bias accumulate onto what is there
        let (w0, b0) = (uniform(5, ch * k, -1.0, 1.0), uniform(6, ch, -1.0, 1.0));
        let (mut dx, mut dw, mut db) = (z(&be, n), t(&be, &w0), t(&be, &b0));
        be.causal_conv1d_silu_backward(&t(&be, &x), &t(&be, &w), &pre, &t(&be, &g), &mut dx, &mut dw, &mut db, s)
            .unwrap();
        let (dx_n, dw_n, db_n) = conv_silu_backward(&s, &x, &w, &pre_n, &g).unwrap();
        let plus = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x + y).collect::<Vec<f32>>();
        assert!(max_rel(&host(&be, &dx), &dx_n) < 1e-5, "conv dx seq {seq}");
        assert!(max_rel(&host(&be, &dw), &plus(&w0, &dw_n)) < 1e-5, "conv dw seq {seq}");
        assert!(max_rel(&host(&be, &db), &plus(&b0, &db_n)) < 1e-5, "conv dbias seq {seq}");
    }
}

#[test]
fn fast_gated_norm_matches_the_naive_norm() {
    let be = CpuBackend::new();
    for (rows, d, groups) in [(70usize, 24usize, 3usize), (5, 40, 1), (33, 64, 4)] {
        let n = rows * d;
        let (y, zz, w, g) =
            (uniform(7, n, -2.0, 2.0), uniform(8, n, -3.0, 3.0), uniform(9, d, 0.5, 1.5), uniform(10, n, -1.0, 1.0));
        let (mut out, mut rstd) = (z(&be, n), z(&be, rows * groups));
        let shaped = |v: &[f32]| be.from_host(HostBuffer::F32(v.to_vec()), &[rows, d]).unwrap();
        let (yt, zt) = (shaped(&y), shaped(&zz));
        be.gated_rmsnorm_forward(&yt, &zt, &t(&be, &w), groups, 1e-5, &mut out, &mut rstd).unwrap();
        let (out_n, rstd_n) = gated_rmsnorm_forward(&y, &zz, &w, groups, 1e-5).unwrap();
        assert!(max_rel(&host(&be, &out), &out_n) < 1e-5, "norm out {rows}x{d}");
        assert!(max_rel(&host(&be, &rstd), &rstd_n) < 1e-5, "norm rstd {rows}x{d}");
        let w0 = uniform(11, d, -1.0, 1.0);
        let (mut dy, mut dz, mut dw) = (z(&be, n), z(&be, n), t(&be, &w0));
        be.gated_rmsnorm_backward(&yt, &zt, &t(&be, &w), groups, &rstd, &shaped(&g), &mut dy, &mut dz, &mut dw)
            .unwrap();
        let (dy_n, dz_n, dw_n) = gated_rmsnorm_backward(&y, &zz, &w, groups, &rstd_n, &g).unwrap();
        let dw_want: Vec<f32> = w0.iter().zip(&dw_n).map(|(a, b)| a + b).collect();
        assert!(max_rel(&host(&be, &dy), &dy_n) < 1e-5, "norm dy {rows}x{d}");
        assert!(max_rel(&host(&be, &dz), &dz_n) < 1e-5, "norm dz {rows}x{d}");
        assert!(max_rel(&host(&be, &dw), &dw_want) < 1e-5, "norm dw {rows}x{d}");
    }
}

#[test]
fn one_and_two_threads_are_bit_identical() {
    let (one, two) = (CpuBackend::with_threads(1).unwrap(), CpuBackend::with_threads(2).unwrap());
    let s = SsdDims { batch: 2, seq: 75, heads: 4, head_dim: 16, groups: 2, state: 8, chunk: 32 };
    let v = scan_data(&s, 99);
    let (r1, r2) = (backend_scan(&one, &s, &v), backend_scan(&two, &s, &v));
    assert!(r1.0 == r2.0 && r1.1 == r2.1 && r1.2 == r2.2, "scan differs between 1 and 2 threads");
    let cs = Conv1dSpec { batch: 3, seq: 75, channels: 20, width: 4 };
    let n = 3 * 75 * 20;
    let (x, w, b, g) =
        (uniform(1, n, -1.0, 1.0), uniform(2, 80, -0.5, 0.5), uniform(3, 20, -0.5, 0.5), uniform(4, n, -1.0, 1.0));
    let conv = |be: &CpuBackend| {
        let (mut out, mut pre) = (z(be, n), z(be, n));
        be.causal_conv1d_silu_forward(&t(be, &x), &t(be, &w), &t(be, &b), &mut out, &mut pre, cs).unwrap();
        let (mut dx, mut dw, mut db) = (z(be, n), z(be, 80), z(be, 20));
        be.causal_conv1d_silu_backward(&t(be, &x), &t(be, &w), &pre, &t(be, &g), &mut dx, &mut dw, &mut db, cs)
            .unwrap();
        [&out, &dx, &dw, &db].map(|v| host(be, v))
    };
    assert!(conv(&one) == conv(&two), "conv differs between 1 and 2 threads");
    let norm = |be: &CpuBackend| {
        let (rows, d) = (225, 20);
        let sh = |v: &[f32]| be.from_host(HostBuffer::F32(v[..rows * d].to_vec()), &[rows, d]).unwrap();
        let (mut out, mut rstd) = (z(be, rows * d), z(be, rows * 2));
        be.gated_rmsnorm_forward(&sh(&x), &sh(&g), &t(be, &b), 2, 1e-5, &mut out, &mut rstd).unwrap();
        let (mut dy, mut dz, mut dw) = (z(be, rows * d), z(be, rows * d), z(be, d));
        be.gated_rmsnorm_backward(&sh(&x), &sh(&g), &t(be, &b), 2, &rstd, &sh(&x), &mut dy, &mut dz, &mut dw).unwrap();
        [&out, &dy, &dz, &dw].map(|v| host(be, v))
    };
    assert!(norm(&one) == norm(&two), "gated norm differs between 1 and 2 threads");
}
