//! Every reducing op gives the same bits on pools of 1, 2 and 4 threads and while a busy
//! competitor thread disturbs the scheduling (issue 10: rayon's `sum`/`reduce` combined partial
//! results along a split tree that changed with the thread count and the machine's load).
//!
//! Shapes are big enough that each reduction has many pieces (sum_squares: 40 chunks,
//! sum_rows/norms: dozens of row blocks), so a pool-dependent combination order would show.

mod common;
use common::*;
use megatron_core::{AttentionOps, AttentionSpec, ElementwiseOps, EmbeddingLossOps, GemmOps, GemmSpec, NormOps};
use megatron_cpu::CpuBackend;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Values spread over many binades, so that regrouping a sum changes its rounding.
fn wide(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.uniform() * 2f32.powi(rng.below(24) as i32 - 12)).collect()
}

fn bits32(v: &[f32]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits() as u64).collect()
}

/// Runs each reducing op once on `be`; returns `(op, output bits)`.
fn run_ops(be: &CpuBackend) -> Vec<(&'static str, Vec<u64>)> {
    let mut rng = Rng::new(0xD37);
    let mut out = Vec::new();

    // Gradient-norm reduction: 40 chunks of 16384.
    // Squares over ~100 binades: every f64 partial sum is rounded.
    let big: Vec<f32> = (0..40 * 16384 + 77).map(|_| rng.uniform() * 2f32.powi(rng.below(50) as i32 - 25)).collect();
    out.push(("sum_squares", vec![be.sum_squares(&tensor(be, &big, &[big.len()])).unwrap().to_bits()]));

    // Bias gradient: 4096 rows of 96 (CHUNK / 96 = 170 rows per piece -> 25 pieces).
    let (n, c) = (4096, 96);
    let x = wide(&mut rng, n * c);
    let mut acc = zeros(be, &[c]);
    be.sum_rows(&tensor(be, &x, &[n, c]), &mut acc).unwrap();
    out.push(("sum_rows", bits32(&host(be, &acc))));

    // Norm weight/bias gradients: 64 blocks of 32 rows.
    let (n, c) = (2048, 64);
    let (xt, dy) = (tensor(be, &rng.vec(n * c, 2.0), &[n, c]), tensor(be, &wide(&mut rng, n * c), &[n, c]));
    let (w, b) = (tensor(be, &rng.vec(c, 1.0), &[c]), tensor(be, &rng.vec(c, 1.0), &[c]));
    let (mut y, mut mean, mut rstd) = (zeros(be, &[n, c]), zeros(be, &[n]), zeros(be, &[n]));
    be.layernorm_forward(&xt, &w, Some(&b), 1e-5, &mut y, &mut mean, &mut rstd).unwrap();
    let (mut dx, mut dw, mut db) = (zeros(be, &[n, c]), zeros(be, &[c]), zeros(be, &[c]));
    be.layernorm_backward(&dy, &xt, &w, &mean, &rstd, &mut dx, &mut dw, Some(&mut db)).unwrap();
    out.push(("layernorm_backward d_x", bits32(&host(be, &dx))));
    out.push(("layernorm_backward d_weight", bits32(&host(be, &dw))));
    out.push(("layernorm_backward d_bias", bits32(&host(be, &db))));
    be.rmsnorm_forward(&xt, &w, 1e-5, &mut y, &mut rstd).unwrap();
    let mut dw = zeros(be, &[c]);
    be.rmsnorm_backward(&dy, &xt, &w, &rstd, &mut dx, &mut dw).unwrap();
    out.push(("rmsnorm_backward d_weight", bits32(&host(be, &dw))));

    // GEMMs big enough for the gemm crate to use every thread, in all transpose layouts
    // (the weight gradient is the TN product with a long K).
    for (m, nn, k, trans_a, trans_b) in
        [(192, 160, 520, false, true), (160, 192, 1030, true, false), (192, 200, 300, false, false)]
    {
        let a = tensor(be, &wide(&mut rng, m * k), &[m * k]);
        let bm = tensor(be, &wide(&mut rng, k * nn), &[k * nn]);
        let bias = tensor(be, &rng.vec(nn, 1.0), &[nn]);
        let mut cm = tensor(be, &rng.vec(m * nn, 1.0), &[m * nn]);
        let spec = GemmSpec { m, n: nn, k, trans_a, trans_b, alpha: 0.75, beta: 1.0 };
        be.gemm(&a, &bm, &mut cm, spec, Some(&bias)).unwrap();
        out.push(("gemm", bits32(&host(be, &cm))));
    }

    // Attention backward: dK/dV sum over queries.
    let spec = AttentionSpec {
        batch: 2,
        seq: 96,
        heads: 3,
        head_dim: 16,
        causal: true,
        scale: 0.25,
        dropout_p: 0.1,
        dropout_seed: 5,
    };
    let numel = 2 * 96 * 3 * 16;
    let qkv = tensor(be, &rng.vec(3 * numel, 1.0), &[2, 96, 3 * 48]);
    let (mut o, mut lse) = (zeros(be, &[2, 96, 48]), zeros(be, &[2 * 3 * 96]));
    be.attention_forward(&qkv, &mut o, &mut lse, spec).unwrap();
    let d_o = tensor(be, &rng.vec(numel, 1.0), &[2, 96, 48]);
    let mut d_qkv = zeros(be, &[2, 96, 3 * 48]);
    be.attention_backward(&d_o, &qkv, &o, &lse, &mut d_qkv, spec).unwrap();
    out.push(("attention_backward", bits32(&host(be, &d_qkv))));

    // Embedding backward with many repeated ids (all rows of one id summed in id order).
    let (rows, c, n) = (50, 40, 3000);
    let idv: Vec<i32> = (0..n).map(|_| rng.below(rows) as i32).collect();
    let dy = tensor(be, &wide(&mut rng, n * c), &[n, c]);
    let mut dt = zeros(be, &[rows, c]);
    be.embedding_backward(&ids(be, &idv), &dy, 0, &mut dt).unwrap();
    out.push(("embedding_backward", bits32(&host(be, &dt))));
    out
}

fn assert_same(what: &str, want: &[(&str, Vec<u64>)], got: &[(&str, Vec<u64>)]) {
    let differ: Vec<String> = want
        .iter()
        .zip(got)
        .filter_map(|((op, a), (_, b))| {
            a.iter().zip(b).position(|(x, y)| x != y).map(|i| format!("{op} (element {i})"))
        })
        .collect();
    assert!(differ.is_empty(), "{what} differs from one thread in: {}", differ.join(", "));
}

/// A thread that keeps one core busy (and the allocator and caches) until dropped.
struct Competitor(Arc<AtomicBool>, Option<std::thread::JoinHandle<()>>);

impl Competitor {
    fn start() -> Competitor {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut v = vec![1.0f64; 1 << 16];
            while !flag.load(Ordering::Relaxed) {
                v.iter_mut().for_each(|x| *x = (*x * 1.000001).sin() + 1.0);
                std::hint::black_box(&v);
            }
        });
        Competitor(stop, Some(handle))
    }
}

impl Drop for Competitor {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        if let Some(h) = self.1.take() {
            let _ = h.join();
        }
    }
}

#[test]
fn reductions_are_bit_identical_across_pool_sizes() {
    let one = run_ops(&CpuBackend::with_threads(1).unwrap());
    for threads in [2, 3, 4] {
        let got = run_ops(&CpuBackend::with_threads(threads).unwrap());
        assert_same(&format!("a pool of {threads} threads"), &one, &got);
    }
}

#[test]
fn reductions_are_bit_identical_under_a_busy_competitor() {
    let one = run_ops(&CpuBackend::with_threads(1).unwrap());
    let _busy = Competitor::start();
    let be = CpuBackend::with_threads(4).unwrap();
    for run in 0..3 {
        assert_same(&format!("run {run} on 4 threads beside a busy thread"), &one, &run_ops(&be));
    }
}
