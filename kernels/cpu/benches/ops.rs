//! Throughput of the CPU backend at GPT-2 124M shapes (12 layers, C=768, 12 heads, T=1024,
//! micro batch 4 → M = 4096 rows): fp32 GEMM GFLOP/s for the three matmuls of every Linear
//! (forward, input grad, weight grad), flash attention forward/backward, and the bandwidth-
//! bound ops. Plain `std::time`; run with `cargo bench -p megatron-cpu --bench ops`
//! (`-- quick` for a shorter run; `-- gemm`, `-- bf16`, `-- attention` or `-- other` for one
//! section). `-- bf16` compares the fp32 GEMM with the bf16 one (AVX512-BF16 kernel and its
//! widened-f32 fallback) per shape and reports the fraction of the bf16 FMA peak measured in
//! the same run.

use megatron_core::{
    ActivationOps, AttentionOps, AttentionSpec, DType, DeviceTensor, EmbeddingLossOps, GemmOps, GemmSpec, HostBuffer,
    MemoryOps, NormOps, OptimizerOps,
};
use megatron_cpu::CpuBackend;
use std::time::Instant;

fn filled(be: &CpuBackend, shape: &[usize], seed: u32) -> DeviceTensor {
    let n: usize = shape.iter().product();
    let v =
        (0..n).map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32 / 16_777_216.0 - 0.5);
    be.from_host(HostBuffer::F32(v.collect()), shape).expect("bench tensor")
}

/// Median seconds of `reps` runs after one warm-up.
fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn bench_linear(be: &CpuBackend, name: &str, m: usize, n: usize, k: usize, reps: usize) {
    let x = filled(be, &[m, k], 1);
    let w = filled(be, &[n, k], 2);
    let dy = filled(be, &[m, n], 3);
    let mut y = be.zeros(&[m, n], DType::F32).unwrap();
    let mut dx = be.zeros(&[m, k], DType::F32).unwrap();
    let mut dw = be.zeros(&[n, k], DType::F32).unwrap();
    let flops = 2.0 * (m * n * k) as f64;
    // forward  y[m,n]  = x[m,k]·W[n,k]^T
    let fwd = time(reps, || be.gemm(&x, &w, &mut y, GemmSpec::linear(m, n, k), None).unwrap());
    // input grad dx[m,k] = dy[m,n]·W[n,k]
    let s_dx = GemmSpec { m, n: k, k: n, trans_a: false, trans_b: false, alpha: 1.0, beta: 0.0 };
    let bwd_x = time(reps, || be.gemm(&dy, &w, &mut dx, s_dx, None).unwrap());
    // weight grad dW[n,k] += dy[m,n]^T·x[m,k]
    let s_dw = GemmSpec { m: n, n: k, k: m, trans_a: true, trans_b: false, alpha: 1.0, beta: 1.0 };
    let bwd_w = time(reps, || be.gemm(&dy, &x, &mut dw, s_dw, None).unwrap());
    println!(
        "gemm {name:<8} M={m} N={n} K={k}: fwd (NT) {:7.1}  dX (NN) {:7.1}  dW (TN, beta=1) {:7.1} GFLOP/s",
        flops / fwd / 1e9,
        flops / bwd_x / 1e9,
        flops / bwd_w / 1e9
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "quick");
    let sections = ["gemm", "bf16", "attention", "other"];
    let any_section = args.iter().any(|a| sections.contains(&a.as_str()));
    let run = |name: &str| !any_section || args.iter().any(|a| a == name);
    let reps = if quick { 2 } else { 5 };
    let be = CpuBackend::new();
    println!(
        "megatron-cpu bench: {} threads, SIMD {}, x86-v4 gemm feature {}",
        be.threads(),
        megatron_cpu::simd::simd_level(),
        cfg!(feature = "x86-v4")
    );
    let (b, t, c, heads, vocab) = (4usize, 1024usize, 768usize, 12usize, 50304usize);
    let m = b * t;
    if run("gemm") {
        bench_linear(&be, "qkv", m, 3 * c, c, reps);
        bench_linear(&be, "attn-out", m, c, c, reps);
        bench_linear(&be, "fc1", m, 4 * c, c, reps);
        bench_linear(&be, "fc2", m, c, 4 * c, reps);
        bench_linear(&be, "lm-head", m, vocab, c, if quick { 1 } else { 3 });
    }
    if run("bf16") {
        bench_bf16(&be, m, c, vocab, quick);
    }
    if run("attention") {
        bench_attention(&be, b, t, heads, c / heads, reps);
    }
    if run("other") {
        bench_other(&be, m, c, vocab, reps);
    }
}

fn bench_attention(be: &CpuBackend, b: usize, t: usize, heads: usize, hd: usize, reps: usize) {
    let c = heads * hd;
    let spec = AttentionSpec {
        batch: b,
        seq: t,
        heads,
        head_dim: hd,
        causal: true,
        scale: 1.0 / (hd as f32).sqrt(),
        dropout_p: 0.0,
        dropout_seed: 0,
    };
    let qkv = filled(be, &[b, t, heads, 3, hd], 4);
    let d_out = filled(be, &[b, t, c], 5);
    let mut out = be.zeros(&[b, t, c], DType::F32).unwrap();
    let mut lse = be.zeros(&[b, heads, t], DType::F32).unwrap();
    let mut d_qkv = be.zeros(&[b, t, heads, 3, hd], DType::F32).unwrap();
    // Causal: half of the T×T scores; 2 matmuls forward, 5 backward, 2·T²/2·hd flops each.
    let mm = (b * heads) as f64 * (t * t) as f64 * hd as f64;
    let fwd = time(reps, || be.attention_forward(&qkv, &mut out, &mut lse, spec).unwrap());
    let bwd = time(reps, || be.attention_backward(&d_out, &qkv, &out, &lse, &mut d_qkv, spec).unwrap());
    println!(
        "attention B={b} H={heads} T={t} hd={hd} causal: fwd {:.1} ms ({:.1} GFLOP/s), bwd {:.1} ms ({:.1} GFLOP/s)",
        fwd * 1e3,
        2.0 * mm / fwd / 1e9,
        bwd * 1e3,
        5.0 * mm / bwd / 1e9
    );
    let drop = AttentionSpec { dropout_p: 0.1, ..spec };
    let fwd_d = time(reps, || be.attention_forward(&qkv, &mut out, &mut lse, drop).unwrap());
    let bwd_d = time(reps, || be.attention_backward(&d_out, &qkv, &out, &lse, &mut d_qkv, drop).unwrap());
    println!("attention with dropout 0.1: fwd {:.1} ms, bwd {:.1} ms", fwd_d * 1e3, bwd_d * 1e3);
    // bf16 q/k/v/dO: the vdpbf16ps kernel (default on AVX512-BF16 AMD CPUs) against the
    // widened fp32 kernel, alternated in the same run.
    let half = |t: &DeviceTensor| {
        let mut h = be.zeros(t.shape(), DType::BF16).unwrap();
        be.cast(t, &mut h).unwrap();
        h
    };
    let (qkv, d_out) = (half(&qkv), half(&d_out));
    let (mut out, mut d_qkv) = (half(&out), half(&d_qkv));
    for (name, kb) in [
        ("bf16 dot", CpuBackend::new().force_bf16_dot(true)),
        ("bf16 widened", CpuBackend::new().force_bf16_fallback(true)),
    ] {
        let fwd = time(reps, || kb.attention_forward(&qkv, &mut out, &mut lse, spec).unwrap());
        let bwd = time(reps, || kb.attention_backward(&d_out, &qkv, &out, &lse, &mut d_qkv, spec).unwrap());
        println!(
            "attention {name}: fwd {:.1} ms ({:.1} GFLOP/s), bwd {:.1} ms ({:.1} GFLOP/s)",
            fwd * 1e3,
            2.0 * mm / fwd / 1e9,
            bwd * 1e3,
            5.0 * mm / bwd / 1e9
        );
    }
}

fn bench_other(be: &CpuBackend, m: usize, c: usize, vocab: usize, reps: usize) {
    let x = filled(be, &[m, c], 6);
    let w = filled(be, &[c], 7);
    let bias = filled(be, &[c], 8);
    let mut y = be.zeros(&[m, c], DType::F32).unwrap();
    let (mut mean, mut rstd) = (be.zeros(&[m], DType::F32).unwrap(), be.zeros(&[m], DType::F32).unwrap());
    let (mut dx, mut dw, mut db) = (
        be.zeros(&[m, c], DType::F32).unwrap(),
        be.zeros(&[c], DType::F32).unwrap(),
        be.zeros(&[c], DType::F32).unwrap(),
    );
    let ln_f = time(reps, || be.layernorm_forward(&x, &w, Some(&bias), 1e-5, &mut y, &mut mean, &mut rstd).unwrap());
    let ln_b = time(reps, || be.layernorm_backward(&x, &x, &w, &mean, &rstd, &mut dx, &mut dw, Some(&mut db)).unwrap());
    println!("layernorm [{m}, {c}]: fwd {:.2} ms, bwd {:.2} ms", ln_f * 1e3, ln_b * 1e3);

    let h = filled(be, &[m, 4 * c], 9);
    let mut g = be.zeros(&[m, 4 * c], DType::F32).unwrap();
    let gf = time(reps, || be.gelu_forward(&h, &mut g).unwrap());
    let mut dh = be.zeros(&[m, 4 * c], DType::F32).unwrap();
    let gb = time(reps, || be.gelu_backward(&h, &g, &mut dh).unwrap());
    println!("gelu [{m}, {}]: fwd {:.2} ms, bwd {:.2} ms", 4 * c, gf * 1e3, gb * 1e3);

    let logits = filled(be, &[m, vocab], 10);
    let targets =
        be.from_host(HostBuffer::I32((0..m as i32).map(|i| (i * 7919) % vocab as i32).collect()), &[m]).unwrap();
    let (mut mx, mut se, mut tl) =
        (be.zeros(&[m], DType::F32).unwrap(), be.zeros(&[m], DType::F32).unwrap(), be.zeros(&[m], DType::F32).unwrap());
    let d_loss = filled(be, &[m], 11);
    let rm = time(reps, || be.row_max(&logits, &mut mx).unwrap());
    let st = time(reps, || be.cross_entropy_stats(&logits, &targets, 0, &mx, &mut se, &mut tl).unwrap());
    let mut dl = filled(be, &[m, vocab], 10);
    let ceb = time(reps, || be.cross_entropy_backward_inplace(&mut dl, &targets, 0, &mx, &se, &d_loss).unwrap());
    println!(
        "cross entropy [{m}, {vocab}]: row_max {:.1} ms, stats {:.1} ms, backward {:.1} ms",
        rm * 1e3,
        st * 1e3,
        ceb * 1e3
    );

    let np = 124_000_000 / 8;
    let (mut p, gr, mut m1, mut m2) =
        (filled(be, &[np], 12), filled(be, &[np], 13), filled(be, &[np], 14), filled(be, &[np], 15));
    let step = megatron_core::AdamStep { lr: 1e-4, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, step: 3 };
    let ad = time(reps, || be.adam_step(&mut p, &gr, &mut m1, &mut m2, step).unwrap());
    println!("adam on {np} params: {:.1} ms (x8 for 124M: {:.0} ms)", ad * 1e3, ad * 8e3);
    let mut e = filled(be, &[m, c], 16);
    let dr = time(reps, || be.dropout(&mut e, 0.1, 7).unwrap());
    let ids = be.from_host(HostBuffer::I32((0..m as i32).map(|i| (i * 31) % vocab as i32).collect()), &[m]).unwrap();
    let table = filled(be, &[vocab, c], 17);
    let mut dtab = be.zeros(&[vocab, c], DType::F32).unwrap();
    let ef = time(reps, || be.embedding_forward(&ids, &table, 0, &mut y, false).unwrap());
    let eb = time(reps, || be.embedding_backward(&ids, &x, 0, &mut dtab).unwrap());
    println!("dropout [{m}, {c}] {:.2} ms; embedding fwd {:.2} ms, bwd {:.2} ms", dr * 1e3, ef * 1e3, eb * 1e3);
    match megatron_cpu::measure_gemm_gflops(be, 1024, 768, 768, 5) {
        Ok(g) => println!("measure_gemm_gflops(1024, 768, 768): {g:.1} GFLOP/s"),
        Err(e) => println!("measure_gemm_gflops failed: {e}"),
    }
}

fn filled_dt(be: &CpuBackend, shape: &[usize], seed: u32, dt: DType) -> DeviceTensor {
    let t = filled(be, shape, seed);
    if dt == DType::F32 {
        return t;
    }
    let mut h = be.zeros(shape, dt).unwrap();
    be.cast(&t, &mut h).unwrap();
    h
}

/// GEMM GFLOP/s of one spec with operands of `dt` (C in `c_dt`).
#[allow(clippy::too_many_arguments)]
fn gemm_rate(be: &CpuBackend, dt: DType, c_dt: DType, spec: GemmSpec, reps: usize) -> f64 {
    let GemmSpec { m, n, k, trans_a, trans_b, .. } = spec;
    let a = filled_dt(be, &if trans_a { [k, m] } else { [m, k] }, 1, dt);
    let b = filled_dt(be, &if trans_b { [n, k] } else { [k, n] }, 2, dt);
    let mut c = be.zeros(&[m, n], c_dt).unwrap();
    let t = time(reps, || be.gemm(&a, &b, &mut c, spec, None).unwrap());
    2.0 * (m * n * k) as f64 / t / 1e9
}

/// fp32 vs bf16 GEMM per GPT-2 124M shape and variant: forward `y = x·W^T` (NT, bf16 out),
/// input grad `dx = dy·W` (NN, bf16 out), weight grad `dW += dy^T·x` (TN, fp32 accumulation).
fn bench_bf16(be: &CpuBackend, m: usize, c: usize, vocab: usize, quick: bool) {
    let (peak_dot, peak_fma) = megatron_cpu::bf16_dot_peak_gflops(be);
    let dot = CpuBackend::new().force_bf16_dot(true);
    let fma = CpuBackend::new().force_bf16_fallback(true);
    println!(
        "bf16 gemm on {} threads: default kernel {}; register-only peaks: vdpbf16ps {peak_dot:.1}, f32 vfmadd \
         {peak_fma:.1} GFLOP/s (0 = no AVX512-BF16)",
        be.threads(),
        be.bf16_gemm_kernel(),
    );
    println!("  f32 = fp32 operands (gemm crate); dot = bf16 operands, vdpbf16ps kernel; fma = bf16 operands");
    println!("  widened to f32 in the packing, AVX-512 FMA kernel; %pk = GFLOP/s / that kernel's instruction peak");
    println!(
        "{:<9} {:<4} {:>6} {:>6} {:>6} | {:>7} {:>7} {:>7} | {:>8} {:>6} {:>6}",
        "shape", "var", "M", "N", "K", "f32", "dot", "fma", "best/f32", "dot%pk", "fma%pk"
    );
    let shapes = [("qkv", 3 * c, c), ("attn-out", c, c), ("fc1", 4 * c, c), ("fc2", c, 4 * c), ("lm-head", vocab, c)];
    // `-- bf16 fc1` (any shape names) restricts the table to those shapes.
    let args: Vec<String> = std::env::args().collect();
    let picked = |name: &str| !shapes.iter().any(|s| args.contains(&s.0.to_string())) || args.iter().any(|a| a == name);
    for (name, out_f, in_f) in shapes.into_iter().filter(|s| picked(s.0)) {
        let reps = if quick || out_f == vocab { 2 } else { 5 };
        let variants = [
            ("fwd", GemmSpec::linear(m, out_f, in_f), DType::BF16),
            (
                "dX",
                GemmSpec { m, n: in_f, k: out_f, trans_a: false, trans_b: false, alpha: 1.0, beta: 0.0 },
                DType::BF16,
            ),
            (
                "dW",
                GemmSpec { m: out_f, n: in_f, k: m, trans_a: true, trans_b: false, alpha: 1.0, beta: 1.0 },
                DType::F32,
            ),
        ];
        for (var, spec, c_dt) in variants {
            let f32r = gemm_rate(be, DType::F32, DType::F32, spec, reps);
            let d = gemm_rate(&dot, DType::BF16, c_dt, spec, reps);
            let f = gemm_rate(&fma, DType::BF16, c_dt, spec, reps);
            println!(
                "{name:<9} {var:<4} {:>6} {:>6} {:>6} | {f32r:>7.1} {d:>7.1} {f:>7.1} | {:>7.2}x {:>5.0}% {:>5.0}%",
                spec.m,
                spec.n,
                spec.k,
                d.max(f) / f32r,
                100.0 * d / peak_dot,
                100.0 * f / peak_fma
            );
        }
    }
}
