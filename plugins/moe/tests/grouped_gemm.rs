//! `Backend::grouped_gemm` of the CPU backend (one parallel pass over all groups) and the
//! core's portable per-group fallback, against a naive f64 triple loop: every transpose
//! combination, beta 0 and 1, empty groups, unequal group sizes (tolerance 1e-5 relative).

mod common;

use common::*;
use megatron_core::grouped_gemm::grouped_gemm_by_loop;
use megatron_core::{Backend, GemmGroup, GroupedGemmSpec};
use megatron_cpu::CpuBackend;

fn naive(a: &[f32], b: &[f32], c: &mut [f32], groups: &[GemmGroup], s: GroupedGemmSpec) {
    for g in groups {
        for i in 0..g.m {
            for j in 0..g.n {
                let mut acc = 0.0f64;
                for l in 0..g.k {
                    let av = if s.trans_a { a[g.a_offset + l * g.m + i] } else { a[g.a_offset + i * g.k + l] };
                    let bv = if s.trans_b { b[g.b_offset + j * g.k + l] } else { b[g.b_offset + l * g.n + j] };
                    acc += av as f64 * bv as f64;
                }
                let o = &mut c[g.c_offset + i * g.n + j];
                *o = (s.alpha as f64 * acc + s.beta as f64 * *o as f64) as f32;
            }
        }
    }
}

#[test]
fn grouped_gemm_matches_naive_loops() {
    let cpu = CpuBackend::with_threads(2).expect("cpu");
    let bk: &dyn Backend = &cpu;
    // Rows per group like an expert dispatch: uneven, one empty, one above the 32-row tile.
    let (sizes, n, k) = ([5usize, 0, 70, 13], 9usize, 11usize);
    for (trans_a, trans_b, beta) in [(false, true, 0.0), (false, false, 1.0), (true, false, 1.0), (true, true, 0.0)] {
        let spec = GroupedGemmSpec { trans_a, trans_b, alpha: 1.0, beta };
        let (mut groups, mut m0) = (Vec::new(), 0);
        for (j, &m) in sizes.iter().enumerate() {
            groups.push(GemmGroup { m, n, k, a_offset: m0 * k, b_offset: j * k * n, c_offset: m0 * n });
            m0 += m;
        }
        let a = rand(m0 * k, 1, 1.0);
        let b = rand(sizes.len() * k * n, 2, 1.0);
        let c0 = rand(m0 * n, 3, 1.0);
        let mut want = c0.clone();
        naive(&a, &b, &mut want, &groups, spec);
        let (at, btt) = (tensor(bk, a, &[m0 * k]), tensor(bk, b, &[sizes.len() * k * n]));
        for fallback in [false, true] {
            let mut ct = tensor(bk, c0.clone(), &[m0 * n]);
            if fallback {
                grouped_gemm_by_loop(bk, &at, &btt, &mut ct, &groups, spec).expect("loop");
            } else {
                bk.grouped_gemm(&at, &btt, &mut ct, &groups, spec).expect("grouped");
            }
            for (i, (g, w)) in ct.host_f32().expect("c").iter().zip(&want).enumerate() {
                assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{spec:?} fallback={fallback} c[{i}]: {g} vs {w}");
            }
        }
    }
}

#[test]
fn overlapping_outputs_are_refused() {
    let cpu = CpuBackend::with_threads(1).expect("cpu");
    let bk: &dyn Backend = &cpu;
    let g = GemmGroup { m: 2, n: 2, k: 2, a_offset: 0, b_offset: 0, c_offset: 0 };
    let g2 = GemmGroup { c_offset: 2, ..g };
    let (a, b) = (tensor(bk, vec![1.0; 4], &[4]), tensor(bk, vec![1.0; 4], &[4]));
    let mut c = tensor(bk, vec![0.0; 8], &[8]);
    let spec = GroupedGemmSpec { trans_a: false, trans_b: false, alpha: 1.0, beta: 0.0 };
    let err = bk.grouped_gemm(&a, &b, &mut c, &[g, g2], spec).expect_err("overlap");
    assert!(err.to_string().contains("overlap"), "{err}");
}
