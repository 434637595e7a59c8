//! Cross-attention next to self-attention of the same size (issue 16): B=4, heads=8, hd=64,
//! T=512 queries and keys; forward and backward medians of the fused self-attention op, the
//! cross-attention op on the same q/k/v (no masks, no bias), and with a `(heads, T, T)` bias
//! plus its gradient and half of the keys padded (T5's encoder). Plain `std::time`; run with
//! `cargo bench -p megatron-cpu --bench cross_attention` (release profile).

use megatron_core::{
    AttentionOps, AttentionSpec, CrossAttentionSpec, DType, DeviceTensor, HostBuffer, MemoryOps, PaddedAttentionOps,
};
use megatron_cpu::CpuBackend;
use std::time::Instant;

fn filled(be: &CpuBackend, n: usize, seed: u32) -> DeviceTensor {
    let v =
        (0..n).map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32 / 16_777_216.0 - 0.5);
    be.from_host(HostBuffer::F32(v.collect()), &[n]).expect("bench tensor")
}

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

fn main() {
    let be = CpuBackend::new();
    let (b, h, hd, t) = (4, 8, 64, 512);
    let reps = 5;
    let z = |n: usize| be.zeros(&[n], DType::F32).unwrap();
    let (n_o, n_l) = (b * t * h * hd, b * h * t);
    let qkv = filled(&be, b * t * h * 3 * hd, 1);
    let dy = filled(&be, n_o, 2);
    let sa = AttentionSpec {
        batch: b,
        seq: t,
        heads: h,
        head_dim: hd,
        causal: false,
        scale: 0.125,
        dropout_p: 0.0,
        dropout_seed: 0,
    };
    let (mut o, mut l, mut dqkv) = (z(n_o), z(n_l), z(b * t * h * 3 * hd));
    let sf = time(reps, || be.attention_forward(&qkv, &mut o, &mut l, sa).unwrap());
    let sb = time(reps, || be.attention_backward(&dy, &qkv, &o, &l, &mut dqkv, sa).unwrap());

    let q = filled(&be, n_o, 3);
    let kv = filled(&be, b * t * h * 2 * hd, 4);
    let cs = CrossAttentionSpec {
        batch: b,
        q_len: t,
        kv_len: t,
        heads: h,
        head_dim: hd,
        causal: false,
        scale: 0.125,
        dropout_p: 0.0,
        dropout_seed: 0,
    };
    let (mut dq, mut dkv) = (z(n_o), z(b * t * h * 2 * hd));
    let cf = time(reps, || be.cross_attention_forward(&q, &kv, None, None, None, &mut o, &mut l, cs).unwrap());
    let cb = time(reps, || {
        be.cross_attention_backward(&dy, &q, &kv, None, None, None, &o, &l, &mut dq, &mut dkv, None, cs).unwrap()
    });

    let bias = filled(&be, h * t * t, 5);
    let mut dbias = z(h * t * t);
    let lens = be.from_host(HostBuffer::I32(vec![t as i32 / 2; b]), &[b]).unwrap();
    let pf =
        time(reps, || be.cross_attention_forward(&q, &kv, None, Some(&lens), Some(&bias), &mut o, &mut l, cs).unwrap());
    let pb = time(reps, || {
        be.cross_attention_backward(
            &dy,
            &q,
            &kv,
            None,
            Some(&lens),
            Some(&bias),
            &o,
            &l,
            &mut dq,
            &mut dkv,
            Some(&mut dbias),
            cs,
        )
        .unwrap()
    });
    println!("B={b} heads={h} hd={hd} T={t}, {} threads, median of {reps}", rayon_threads());
    println!("{:<44} {:>10} {:>10}", "", "fwd ms", "bwd ms");
    for (name, f, bw) in [
        ("self-attention (fused qkv)", sf, sb),
        ("cross-attention, same q/k/v", cf, cb),
        ("cross-attention, bias + d_bias, keys half pad", pf, pb),
    ] {
        println!("{name:<44} {:>10.2} {:>10.2}   ({:.2}x / {:.2}x self)", f * 1e3, bw * 1e3, f / sf, bw / sb);
    }
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
