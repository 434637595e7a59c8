//! Ring-attention block ops (`attention_block_forward`, `attention_lse_merge`,
//! `attention_block_backward`, context parallelism): the kernels against the f64 reference
//! (causal by explicit positions, with a query that sees no key of a block, and non-causal);
//! two blocks merged by log-sum-exp equal attention over both key sets at once; the summed
//! block backwards (kernel and reference) equal finite differences of the merged forward.

mod common;
use common::*;
use megatron_core::{AttentionBlockSpec, DeviceTensor, ElementwiseOps, MemoryOps, RingAttentionOps};
use megatron_cpu::reference as r;

fn spec(k_len: usize, causal: bool) -> AttentionBlockSpec {
    AttentionBlockSpec { batch: 2, q_len: 6, k_len, heads: 2, head_dim: 4, scale: 0.5, causal }
}

const Q_POS: [i32; 6] = [3, 7, 1, 9, 5, 0];
const K1_POS: [i32; 5] = [0, 2, 4, 6, 8];
const K2_POS: [i32; 5] = [1, 3, 5, 7, 9];

/// `-inf` exactly where the reference has it, then the finite values within tolerance.
fn assert_stats(what: &str, got: &[f32], want: &[f64]) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g == f32::NEG_INFINITY, w == f64::NEG_INFINITY, "{what}[{i}]: {g} vs {w}");
    }
    let keep = |x: f64| if x == f64::NEG_INFINITY { 0.0 } else { x };
    let got: Vec<f32> = got.iter().map(|&g| keep(g as f64) as f32).collect();
    assert_close(what, &got, &want.iter().map(|&w| keep(w)).collect::<Vec<_>>(), 2e-5, 1e-4);
}

/// Concatenates two `(B, T, heads, hd)` blocks along T.
fn concat(s: &AttentionBlockSpec, a: &[f64], b: &[f64]) -> Vec<f64> {
    let row = s.k_len * s.heads * s.head_dim;
    (0..s.batch).flat_map(|i| a[i * row..(i + 1) * row].iter().chain(&b[i * row..(i + 1) * row]).copied()).collect()
}

struct Block {
    k: DeviceTensor,
    v: DeviceTensor,
    pos: DeviceTensor,
}

#[test]
fn block_forward_merge_and_backward_match_the_reference() {
    let be = backend();
    for causal in [true, false] {
        let s = spec(5, causal);
        let mut rng = Rng::new(11 + causal as u64);
        let (q, k1, v1, k2, v2, g) = (
            rng.vec(s.q_numel(), 1.5),
            rng.vec(s.k_numel(), 1.5),
            rng.vec(s.k_numel(), 1.0),
            rng.vec(s.k_numel(), 1.5),
            rng.vec(s.k_numel(), 1.0),
            rng.vec(s.q_numel(), 1.0),
        );
        let shape_q = [s.batch, s.q_len, s.heads, s.head_dim];
        let shape_k = [s.batch, s.k_len, s.heads, s.head_dim];
        let (qt, qp) = (tensor(&be, &q, &shape_q), ids(&be, &Q_POS));
        let blocks = [
            Block { k: tensor(&be, &k1, &shape_k), v: tensor(&be, &v1, &shape_k), pos: ids(&be, &K1_POS) },
            Block { k: tensor(&be, &k2, &shape_k), v: tensor(&be, &v2, &shape_k), pos: ids(&be, &K2_POS) },
        ];
        // Reference: each block, the merge, and the whole key set at once.
        let (wq, wg) = (widen(&q), widen(&g));
        let (ro1, rl1) = r::attention_block_forward(&wq, &widen(&k1), &widen(&v1), &Q_POS, &K1_POS, &s);
        let (ro2, rl2) = r::attention_block_forward(&wq, &widen(&k2), &widen(&v2), &Q_POS, &K2_POS, &s);
        let (mut mo, mut ml) = (vec![0.0; s.q_numel()], vec![f64::NEG_INFINITY; s.stat_numel()]);
        r::attention_lse_merge(&mut mo, &mut ml, &ro1, &rl1, &s);
        r::attention_lse_merge(&mut mo, &mut ml, &ro2, &rl2, &s);
        let both = AttentionBlockSpec { k_len: 10, ..s };
        let pos: Vec<i32> = K1_POS.iter().chain(&K2_POS).copied().collect();
        let (kk, vv) = (concat(&s, &widen(&k1), &widen(&k2)), concat(&s, &widen(&v1), &widen(&v2)));
        let (fo, fl) = r::attention_block_forward(&wq, &kk, &vv, &Q_POS, &pos, &both);
        assert_close64("reference merge vs whole key set: out", &mo, &fo, 1e-12, 1e-10);
        assert_close64("reference merge vs whole key set: lse", &ml, &fl, 1e-12, 1e-10);
        if causal {
            assert!(rl2.contains(&f64::NEG_INFINITY), "the test must cover a query that sees no key of a block");
        }
        // Kernels: block forward, merge.
        let mut out = zeros(&be, &shape_q);
        let mut lse = be
            .from_host(megatron_core::HostBuffer::F32(vec![f32::NEG_INFINITY; s.stat_numel()]), &[s.stat_numel()])
            .unwrap();
        let (mut bo, mut bl) = (zeros(&be, &shape_q), zeros(&be, &[s.stat_numel()]));
        for (blk, (ro, rl)) in blocks.iter().zip([(&ro1, &rl1), (&ro2, &rl2)]) {
            be.fill(&mut bo, f32::NAN).unwrap(); // every element must be written
            be.attention_block_forward(&qt, &blk.k, &blk.v, &qp, &blk.pos, &mut bo, &mut bl, s).unwrap();
            assert_close(&format!("causal {causal}: block out"), &host(&be, &bo), ro, 2e-5, 1e-4);
            assert_stats(&format!("causal {causal}: block lse"), &host(&be, &bl), rl);
            be.attention_lse_merge(&mut out, &mut lse, &bo, &bl, s).unwrap();
        }
        assert_close(&format!("causal {causal}: merged out"), &host(&be, &out), &mo, 2e-5, 1e-4);
        assert_stats(&format!("causal {causal}: merged lse"), &host(&be, &lse), &ml);
        // Backward with the final statistics: kernel (accumulating over both blocks) vs reference.
        let delta: Vec<f64> = (0..s.stat_numel())
            .map(|si| {
                let (b, h, i) = (si / (s.heads * s.q_len), (si / s.q_len) % s.heads, si % s.q_len);
                let at = ((b * s.q_len + i) * s.heads + h) * s.head_dim;
                (0..s.head_dim).map(|e| wg[at + e] * mo[at + e]).sum()
            })
            .collect();
        let dt = tensor(&be, &delta.iter().map(|&x| x as f32).collect::<Vec<_>>(), &[s.stat_numel()]);
        let gt = tensor(&be, &g, &shape_q);
        let mut dq = zeros(&be, &shape_q);
        let mut want_dq = vec![0.0; s.q_numel()];
        for (blk, (k, v, kp)) in blocks.iter().zip([(&k1, &v1, &K1_POS), (&k2, &v2, &K2_POS)]) {
            let (mut dk, mut dv) = (zeros(&be, &shape_k), zeros(&be, &shape_k));
            be.attention_block_backward(
                &gt, &qt, &blk.k, &blk.v, &qp, &blk.pos, &lse, &dt, &mut dq, &mut dk, &mut dv, s,
            )
            .unwrap();
            let (rq, rk, rv) = r::attention_block_backward(&wg, &wq, &widen(k), &widen(v), &Q_POS, kp, &ml, &delta, &s);
            want_dq.iter_mut().zip(&rq).for_each(|(a, b)| *a += b);
            assert_close(&format!("causal {causal}: dk"), &host(&be, &dk), &rk, 1e-4, 1e-3);
            assert_close(&format!("causal {causal}: dv"), &host(&be, &dv), &rv, 1e-4, 1e-3);
        }
        assert_close(&format!("causal {causal}: dq (two blocks)"), &host(&be, &dq), &want_dq, 1e-4, 1e-3);
    }
}

#[test]
fn summed_block_backwards_equal_finite_differences_of_the_merged_forward() {
    let be = backend();
    let s = spec(5, true);
    let mut rng = Rng::new(5);
    let x: Vec<f32> = rng.vec(s.q_numel() + 4 * s.k_numel(), 1.2);
    let g = widen(&rng.vec(s.q_numel(), 1.0));
    let (nq, nk) = (s.q_numel(), s.k_numel());
    // L(q, k1, v1, k2, v2) = Σ g · merge(block 1, block 2), in f64.
    let merged = |x: &[f64]| {
        let q = &x[..nq];
        let part = |i: usize| &x[nq + i * nk..nq + (i + 1) * nk];
        let (o1, l1) = r::attention_block_forward(q, part(0), part(1), &Q_POS, &K1_POS, &s);
        let (o2, l2) = r::attention_block_forward(q, part(2), part(3), &Q_POS, &K2_POS, &s);
        let (mut o, mut l) = (vec![0.0; nq], vec![f64::NEG_INFINITY; s.stat_numel()]);
        r::attention_lse_merge(&mut o, &mut l, &o1, &l1, &s);
        r::attention_lse_merge(&mut o, &mut l, &o2, &l2, &s);
        (o, l)
    };
    let wx = widen(&x);
    let fd = finite_diff(&wx, 1e-5, |x| dot(&merged(x).0, &g));
    let (o, l) = merged(&wx);
    let delta: Vec<f64> = (0..s.stat_numel())
        .map(|si| {
            let (b, h, i) = (si / (s.heads * s.q_len), (si / s.q_len) % s.heads, si % s.q_len);
            let at = ((b * s.q_len + i) * s.heads + h) * s.head_dim;
            (0..s.head_dim).map(|e| g[at + e] * o[at + e]).sum()
        })
        .collect();
    // Reference backward, block by block, vs finite differences (f64: tight).
    let mut want = vec![0.0; wx.len()];
    for (blk, kp) in [(0usize, &K1_POS), (1, &K2_POS)] {
        let (k, v) =
            (&wx[nq + 2 * blk * nk..nq + (2 * blk + 1) * nk], &wx[nq + (2 * blk + 1) * nk..nq + (2 * blk + 2) * nk]);
        let (dq, dk, dv) = r::attention_block_backward(&g, &wx[..nq], k, v, &Q_POS, kp, &l, &delta, &s);
        want[..nq].iter_mut().zip(&dq).for_each(|(a, b)| *a += b);
        want[nq + 2 * blk * nk..nq + (2 * blk + 1) * nk].copy_from_slice(&dk);
        want[nq + (2 * blk + 1) * nk..nq + (2 * blk + 2) * nk].copy_from_slice(&dv);
    }
    assert_close64("reference block backward vs finite differences", &want, &fd, 1e-7, 1e-6);
    // Kernel backward (f32) vs the same finite differences.
    let sh_q = [s.batch, s.q_len, s.heads, s.head_dim];
    let sh_k = [s.batch, s.k_len, s.heads, s.head_dim];
    let t = |r: std::ops::Range<usize>, sh: &[usize]| tensor(&be, &x[r], sh);
    let (qt, gt, qp) =
        (t(0..nq, &sh_q), tensor(&be, &g.iter().map(|&v| v as f32).collect::<Vec<_>>(), &sh_q), ids(&be, &Q_POS));
    let lt = tensor(&be, &l.iter().map(|&v| v as f32).collect::<Vec<_>>(), &[s.stat_numel()]);
    let dt = tensor(&be, &delta.iter().map(|&v| v as f32).collect::<Vec<_>>(), &[s.stat_numel()]);
    let mut dq = zeros(&be, &sh_q);
    let mut got = vec![0.0f32; wx.len()];
    for (blk, kp) in [(0usize, &K1_POS[..]), (1, &K2_POS[..])] {
        let (k, v) = (
            t(nq + 2 * blk * nk..nq + (2 * blk + 1) * nk, &sh_k),
            t(nq + (2 * blk + 1) * nk..nq + (2 * blk + 2) * nk, &sh_k),
        );
        let (mut dk, mut dv) = (zeros(&be, &sh_k), zeros(&be, &sh_k));
        be.attention_block_backward(&gt, &qt, &k, &v, &qp, &ids(&be, kp), &lt, &dt, &mut dq, &mut dk, &mut dv, s)
            .unwrap();
        got[nq + 2 * blk * nk..nq + (2 * blk + 1) * nk].copy_from_slice(&host(&be, &dk));
        got[nq + (2 * blk + 1) * nk..nq + (2 * blk + 2) * nk].copy_from_slice(&host(&be, &dv));
    }
    got[..nq].copy_from_slice(&host(&be, &dq));
    assert_close("kernel block backward vs finite differences", &got, &fd, 2e-4, 2e-3);
}
