//! The bf16 attention kernels (AVX512-BF16 `vdpbf16ps` tiles, bf16 q/k/v/dO read directly)
//! against the f64 reference on the same bf16-rounded inputs, forward and backward, causal and
//! full, dropout on and off, odd T / head_dim (pair padding) and T past one tile; and the
//! results bit-identical on 1 and 2 threads. Skips (with a message) on CPUs without
//! AVX512-BF16, where bf16 attention takes the widened fp32 kernel (tested in `half_dtypes`).
//!
//! Tolerances (`|got − want| ≤ atol + rtol·|want|`). Products of bf16 are exact in f32; the
//! error comes from rounding `P` and `dS` to bf16 (relative 2^-9 each) before their products,
//! from the stored bf16 `out` in `D_i`, and from rounding the outputs:
//! * `out`: `|Δ| ≤ 2^-9·Σ_j P_ij·|v_j| ≤ 2^-9·max|v|`, plus the output rounding: checked with
//!   `atol = 2^-8·max|v|` (a 2× margin) and `rtol = 4e-3 + 1e-4`;
//! * `lse`: fp32 statistics of exact bf16 products: the fp32 tolerance, 2e-5 abs + 1e-4 rel;
//! * `d_qkv`: sums over up to T terms of `P`/`dS` rounded by 2^-9: per slot (dq, dk, dv)
//!   `atol = 2^-7·max|want of the slot|`, `rtol = 5e-3`.

mod common;
use common::{assert_close, Rng};
use megatron_core::half::bf16;
use megatron_core::{AttentionOps, AttentionSpec, DType, DeviceTensor, ElementwiseOps, HostBuffer, MemoryOps};
use megatron_cpu::reference as r;
use megatron_cpu::CpuBackend;

fn bf16_tensor(be: &CpuBackend, x: &[f32], shape: &[usize]) -> (DeviceTensor, Vec<f64>) {
    let v: Vec<bf16> = x.iter().map(|&a| bf16::from_f32(a)).collect();
    let want = v.iter().map(|a| a.to_f64()).collect();
    (be.from_host(HostBuffer::BF16(v), shape).unwrap(), want)
}

fn read(be: &CpuBackend, t: &DeviceTensor) -> Vec<f32> {
    be.to_host(t).unwrap().to_f32_vec()
}

fn spec(batch: usize, seq: usize, heads: usize, head_dim: usize, causal: bool, p: f32) -> AttentionSpec {
    let scale = 1.0 / (head_dim as f32).sqrt();
    AttentionSpec { batch, seq, heads, head_dim, causal, scale, dropout_p: p, dropout_seed: 77 }
}

/// Forward + backward on `be`: `(out, lse, d_qkv)` as f32.
fn run(be: &CpuBackend, s: AttentionSpec, qkv: &DeviceTensor, g: &DeviceTensor) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut out = be.zeros(&[s.batch, s.seq, s.heads * s.head_dim], DType::BF16).unwrap();
    let mut lse = be.zeros(&[s.batch, s.heads, s.seq], DType::F32).unwrap();
    be.attention_forward(qkv, &mut out, &mut lse, s).unwrap();
    let mut dq = be.zeros(qkv.shape(), DType::BF16).unwrap();
    be.fill(&mut dq, f32::NAN).unwrap(); // backward must overwrite every element
    be.attention_backward(g, qkv, &out, &lse, &mut dq, s).unwrap();
    assert_eq!((out.dtype(), dq.dtype()), (DType::BF16, DType::BF16));
    (read(be, &out), read(be, &lse), read(be, &dq))
}

fn check(s: AttentionSpec, seed: u64) {
    let be = CpuBackend::new().force_bf16_dot(true);
    let mut rng = Rng::new(seed);
    let shape = [s.batch, s.seq, s.heads, 3, s.head_dim];
    let (qkv, x) = bf16_tensor(&be, &rng.vec(shape.iter().product(), 1.5), &shape);
    let (g, gw) = bf16_tensor(
        &be,
        &rng.vec(s.batch * s.seq * s.heads * s.head_dim, 1.0),
        &[s.batch, s.seq, s.heads * s.head_dim],
    );
    let (out, lse, dqkv) = run(&be, s, &qkv, &g);
    let (want_out, want_lse) = r::attention_forward(&x, &s);
    let max_v = x.iter().map(|v| v.abs()).fold(0.0, f64::max);
    assert_close(&format!("bf16 attention out {s:?}"), &out, &want_out, max_v / 256.0, 4.1e-3);
    assert_close(&format!("bf16 attention lse {s:?}"), &lse, &want_lse, 2e-5, 1e-4);
    let want = r::attention_backward(&gw, &x, &s);
    // Split d_qkv (B, T, heads, 3, hd) by slot so each gets its own scale.
    let hd = s.head_dim;
    for slot in 0..3 {
        let pick = |v: &[f32]| -> Vec<f32> { v.chunks_exact(hd).skip(slot).step_by(3).flatten().copied().collect() };
        let (got, want): (Vec<f32>, Vec<f64>) = {
            let w: Vec<f64> = want.chunks_exact(hd).skip(slot).step_by(3).flatten().copied().collect();
            (pick(&dqkv), w)
        };
        let max_w = want.iter().map(|v| v.abs()).fold(0.0, f64::max);
        assert_close(&format!("bf16 attention d_qkv slot {slot} {s:?}"), &got, &want, max_w / 128.0, 5e-3);
    }
    // Thread-count independence: 1 and 2 threads give the same bits.
    let one = run(&CpuBackend::with_threads(1).unwrap().force_bf16_dot(true), s, &qkv, &g);
    let two = run(&CpuBackend::with_threads(2).unwrap().force_bf16_dot(true), s, &qkv, &g);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&one.0), bits(&two.0), "out differs between 1 and 2 threads");
    assert_eq!(bits(&one.1), bits(&two.1), "lse differs between 1 and 2 threads");
    assert_eq!(bits(&one.2), bits(&two.2), "d_qkv differs between 1 and 2 threads");
}

fn supported() -> bool {
    let ok = megatron_cpu::bf16_dot_supported();
    if !ok {
        eprintln!("SKIP: this CPU has no AVX512-BF16 (bf16 attention widens through the fp32 kernel)");
    }
    ok
}

#[test]
fn causal_multi_tile_odd_seq() {
    // T = 151 = 2·64 + 23 (odd: the last key/query pair is padded), head_dim 64 as in GPT-2.
    if supported() {
        check(spec(2, 151, 2, 64, true, 0.0), 1);
    }
}

#[test]
fn full_attention_odd_head_dim() {
    if supported() {
        check(spec(1, 70, 3, 9, false, 0.0), 2);
    }
}

#[test]
fn causal_with_dropout() {
    if supported() {
        check(spec(2, 96, 2, 16, true, 0.1), 3);
    }
}
