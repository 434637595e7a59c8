//! Fast CPU kernels of the Mamba-2 ops (the CPU backend's Backend ops) against the naive
//! references of `megatron_hybrid::ops` (scalar loops, also parallel over batch × heads):
//! causal conv1d + SiLU, the SSD chunked scan and the gated RMSNorm, forward and backward,
//! ms and the speed-up, measured in the same run. Two shapes: the tiny
//! model of `scripts/hybrid_speed.sh` (hidden 128: H 8, P 32, N 32) and a 124M-like mixer
//! (hidden 768, expand 2: H 24, P 64, N 128), both one sequence of 1024 tokens, chunk 128,
//! conv width 4, one group; the best of 7 runs (3 with `quick`). Run: `cargo bench -p megatron-hybrid --bench mamba_ops`
//! (`-- tiny` or `-- 124m` for one shape, `-- quick` for fewer repetitions).

use megatron_core::{Conv1dSpec, DType, DeviceTensor, HostBuffer, MambaOps, MemoryOps, SsdGradTensors, SsdTensors};
use megatron_cpu::CpuBackend;
use megatron_hybrid::ops::conv::{conv_silu_backward, conv_silu_forward};
use megatron_hybrid::ops::gated_norm::{gated_rmsnorm_backward, gated_rmsnorm_forward};
use megatron_hybrid::ops::ssd::{ssd_backward, ssd_forward, SsdInputs};
use megatron_hybrid::ops::SsdDims;
use std::time::Instant;

fn data(n: usize, seed: u32, lo: f32, hi: f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let u =
                ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed.wrapping_mul(97)) >> 8) as f32 / 16_777_216.0;
            lo + (hi - lo) * u
        })
        .collect()
}

/// The fastest of `reps` runs after one warm-up, in seconds (on a shared machine the minimum is
/// the run least disturbed by other processes).
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
    t[0]
}

fn report(name: &str, fast: f64, naive: f64) {
    println!(
        "  {name:<22} fast {:>9.2} ms   naive {:>9.2} ms   speed-up {:>6.1}x",
        fast * 1e3,
        naive * 1e3,
        naive / fast
    );
}

fn t(be: &CpuBackend, v: &[f32], shape: &[usize]) -> DeviceTensor {
    be.from_host(HostBuffer::F32(v.to_vec()), shape).expect("bench tensor")
}

fn z(be: &CpuBackend, n: usize) -> DeviceTensor {
    be.zeros(&[n], DType::F32).expect("bench tensor")
}

fn bench_shape(be: &CpuBackend, label: &str, hidden: usize, heads: usize, p: usize, n: usize, reps: usize) {
    let (seq, chunk, k) = (1024, 128, 4);
    let di = heads * p;
    let ch = di + 2 * n;
    println!("{label}: hidden {hidden}, heads {heads} x head_dim {p}, state {n}, seq {seq}, chunk {chunk}");
    // conv
    let cs = Conv1dSpec { batch: 1, seq, channels: ch, width: k };
    let (x, w, b, g) = (
        data(seq * ch, 1, -1.0, 1.0),
        data(ch * k, 2, -0.5, 0.5),
        data(ch, 3, -0.5, 0.5),
        data(seq * ch, 4, -1.0, 1.0),
    );
    let (xt, wt, bt, gt) = (t(be, &x, &[seq, ch]), t(be, &w, &[ch * k]), t(be, &b, &[ch]), t(be, &g, &[seq, ch]));
    let (mut out, mut pre) = (z(be, seq * ch), z(be, seq * ch));
    let fast = time(reps, || be.causal_conv1d_silu_forward(&xt, &wt, &bt, &mut out, &mut pre, cs).unwrap());
    let naive = time(reps, || drop(conv_silu_forward(&cs, &x, &w, &b).unwrap()));
    report("conv1d+silu forward", fast, naive);
    let pre_h = conv_silu_forward(&cs, &x, &w, &b).unwrap().1;
    let (mut dx, mut dw, mut db) = (z(be, seq * ch), z(be, ch * k), z(be, ch));
    let fast =
        time(reps, || be.causal_conv1d_silu_backward(&xt, &wt, &pre, &gt, &mut dx, &mut dw, &mut db, cs).unwrap());
    let naive = time(reps, || drop(conv_silu_backward(&cs, &x, &w, &pre_h, &g).unwrap()));
    report("conv1d+silu backward", fast, naive);
    // scan
    let s = SsdDims { batch: 1, seq, heads, head_dim: p, groups: 1, state: n, chunk };
    let v = [
        data(seq * di, 5, -1.0, 1.0),
        data(seq * heads, 6, 0.01, 0.3),
        data(heads, 7, -3.0, -0.5),
        data(seq * n, 8, -1.0, 1.0),
        data(seq * n, 9, -1.0, 1.0),
        data(heads, 10, 0.5, 1.5),
        data(seq * di, 11, -1.0, 1.0),
    ];
    let ts: Vec<DeviceTensor> = v.iter().map(|a| t(be, a, &[a.len()])).collect();
    let inputs = SsdTensors { x: &ts[0], dt: &ts[1], a: &ts[2], b: &ts[3], c: &ts[4], d: &ts[5] };
    let naive_in = SsdInputs { x: &v[0], dt: &v[1], a: &v[2], bm: &v[3], cm: &v[4], d: &v[5] };
    let (mut y, mut states) = (z(be, seq * di), z(be, s.states_len()));
    let fast = time(reps, || be.ssd_scan_forward(inputs, &mut y, &mut states, s).unwrap());
    let naive = time(reps, || drop(ssd_forward(&s, &naive_in).unwrap()));
    report("ssd scan forward", fast, naive);
    let states_h = ssd_forward(&s, &naive_in).unwrap().1;
    let mut gs: Vec<DeviceTensor> = v[..6].iter().map(|a| z(be, a.len())).collect();
    let fast = time(reps, || {
        let [gx, gdt, ga, gb, gc, gd] = &mut gs[..] else { unreachable!() };
        let grads = SsdGradTensors { x: gx, dt: gdt, a: ga, b: gb, c: gc, d: gd };
        be.ssd_scan_backward(inputs, &states, &ts[6], grads, s).unwrap()
    });
    let naive = time(reps, || drop(ssd_backward(&s, &naive_in, &states_h, &v[6]).unwrap()));
    report("ssd scan backward", fast, naive);
    // gated norm
    let (yv, zv, nw) = (data(seq * di, 12, -2.0, 2.0), data(seq * di, 13, -3.0, 3.0), data(di, 14, 0.5, 1.5));
    let (yt, zt, nwt, gt) =
        (t(be, &yv, &[seq, di]), t(be, &zv, &[seq, di]), t(be, &nw, &[di]), t(be, &v[6], &[seq, di]));
    let (mut o, mut rstd) = (z(be, seq * di), z(be, seq));
    let fast = time(reps, || be.gated_rmsnorm_forward(&yt, &zt, &nwt, 1, 1e-5, &mut o, &mut rstd).unwrap());
    let naive = time(reps, || drop(gated_rmsnorm_forward(&yv, &zv, &nw, 1, 1e-5).unwrap()));
    report("gated rmsnorm forward", fast, naive);
    let rstd_h = gated_rmsnorm_forward(&yv, &zv, &nw, 1, 1e-5).unwrap().1;
    let (mut dy, mut dz, mut dnw) = (z(be, seq * di), z(be, seq * di), z(be, di));
    let fast =
        time(reps, || be.gated_rmsnorm_backward(&yt, &zt, &nwt, 1, &rstd, &gt, &mut dy, &mut dz, &mut dnw).unwrap());
    let naive = time(reps, || drop(gated_rmsnorm_backward(&yv, &zv, &nw, 1, &rstd_h, &v[6]).unwrap()));
    report("gated rmsnorm backward", fast, naive);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let reps = if args.iter().any(|a| a == "quick") { 3 } else { 7 };
    let want = |s: &str| !args.iter().any(|a| a == "tiny" || a == "124m") || args.iter().any(|a| a == s);
    let be = CpuBackend::new();
    println!("mamba ops: {} threads, simd {}", be.threads(), megatron_cpu::simd::simd_level());
    if want("tiny") {
        bench_shape(&be, "tiny (scripts/hybrid_speed.sh mamba)", 128, 8, 32, 32, reps);
    }
    if want("124m") {
        bench_shape(&be, "124M-like mixer", 768, 24, 64, 128, reps);
    }
}
