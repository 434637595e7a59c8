//! Context-parallel ring attention in bf16 and fp16 (`megatron_transformer::context_parallel`,
//! SPEC §5.9), cp ranks as threads with Megatron's chunks `r` and `2cp−1−r`, cp 2 and 3,
//! causal and not. Three checks:
//!
//! 1. Exactly one rounding: the half ring's output, log-sum-exp and q/k/v gradients are
//!    bitwise the fp32 ring's on the same (widened) half inputs, rounded once to the half type
//!    (the lse not at all). So the K/V blocks travel without loss, the partial outputs are merged
//!    in f32 and dK/dV accumulate in f32 around the ring: a half merge, a per-hop rounding of
//!    dK/dV or a block rounded on the way breaks the bits. The fp32 ring equals the single-rank
//!    attention to 1e-5 (`tests/ring_attention.rs`).
//! 2. Against the single-rank f32 backend attention on the whole sequence (checked against
//!    finite differences in its crate), whose backward sees its output rounded to half as the
//!    model stores it: output and q/k/v gradients within `u + 2e-5` of the largest value, `u` =
//!    2^-8 (bf16) or 2^-11 (fp16) the unit roundoff. Derivation: by 1. each half value is
//!    `round(r)` of the f32 ring's `r`, so `|round(r) − ref| ≤ u·|r| + |r − ref|`, and the f32
//!    ring is within 1e-5 of the largest reference value (`tests/ring_attention.rs`, measured
//!    ≤ 4.6e-7); the lse is f32 throughout (1e-5 as in fp32).
//! 3. Rotary embeddings per chunk (Llama-style models): each CP rank's half `qkv` rotated at its
//!    chunks' global offsets is bitwise the whole half sequence rotated by the backend and cut
//!    to the rank's positions, forward and inverse, and stays half. (The end-to-end tiny GPT
//!    trains on mock data with near-uniform attention, too weak a signal for a wrong offset.)

mod common;

use common::{backend, lcg_values, max_abs_rel, rows};
use megatron_comm_local::LocalCommunicator;
use megatron_core::{AttentionSpec, Backend, DType, DeviceTensor, HostBuffer, RankGrid, RotarySpec};
use megatron_transformer::context_parallel::{
    local_positions, ring_attention_backward, ring_attention_forward, rotary_context_parallel,
};

/// The test's inputs: [`lcg_values`] from `seed + 7`.
fn lcg(n: usize, seed: u64) -> Vec<f32> {
    lcg_values(n, seed.wrapping_add(7))
}

/// `v` as a `dtype` tensor (rounded once by the backend's cast).
fn tensor(bk: &dyn Backend, v: &[f32], shape: &[usize], dtype: DType) -> DeviceTensor {
    let t = bk.from_host(HostBuffer::F32(v.to_vec()), shape).unwrap();
    let mut h = bk.zeros(shape, dtype).unwrap();
    bk.cast(&t, &mut h).unwrap();
    h
}

/// `v` rounded to `dtype` and widened back.
fn round(bk: &dyn Backend, v: &[f32], dtype: DType) -> Vec<f32> {
    bk.to_host(&tensor(bk, v, &[v.len()], dtype)).unwrap().to_f32_vec()
}

fn host(bk: &dyn Backend, x: &DeviceTensor) -> Vec<f32> {
    bk.to_host(x).unwrap().to_f32_vec()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn check(dtype: DType, cp: usize, causal: bool) {
    let (b, t, h, d) = (2, 4 * cp, 2, 8);
    let bk = backend();
    let bk = bk.as_ref();
    let spec = |seq| AttentionSpec {
        batch: b,
        seq,
        heads: h,
        head_dim: d,
        causal,
        scale: 1.0 / (d as f32).sqrt(),
        dropout_p: 0.0,
        dropout_seed: 0,
    };
    // The half inputs, and their exact f32 values.
    let qkv = round(bk, &lcg(b * t * h * 3 * d, 3), dtype);
    let d_out = round(bk, &lcg(b * t * h * d, 4), dtype);
    // f32 reference on the whole sequence; its backward sees the output as stored (rounded).
    let f32t = |v: &[f32], shape: &[usize]| bk.from_host(HostBuffer::F32(v.to_vec()), shape).unwrap();
    let qkv_t = f32t(&qkv, &[b, t, h * 3 * d]);
    let mut out = bk.zeros(&[b, t, h * d], DType::F32).unwrap();
    let mut lse = bk.zeros(&[b, h, t], DType::F32).unwrap();
    bk.attention_forward(&qkv_t, &mut out, &mut lse, spec(t)).unwrap();
    let out = host(bk, &out);
    let out_stored = f32t(&round(bk, &out, dtype), &[b, t, h * d]);
    let mut d_qkv = bk.zeros(&[b, t, h * 3 * d], DType::F32).unwrap();
    bk.attention_backward(&f32t(&d_out, &[b, t, h * d]), &qkv_t, &out_stored, &lse, &mut d_qkv, spec(t)).unwrap();
    let (lse, d_qkv) = (host(bk, &lse), host(bk, &d_qkv));

    let grid = RankGrid::new(cp, 1, cp, 1).unwrap();
    let comms = LocalCommunicator::world(cp, std::time::Duration::from_secs(60));
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..cp)
            .map(|r| {
                let (ctx, qkv, d_out) = (grid.context(r, comms[r].clone()), &qkv, &d_out);
                s.spawn(move || {
                    let bk = backend();
                    let bk = bk.as_ref();
                    let pos = local_positions(t, cp, ctx.cp_rank);
                    let tl = pos.len();
                    let (q, g) = (rows(qkv, b, t, h * 3 * d, &pos), rows(d_out, b, t, h * d, &pos));
                    // The ring in `dt` on the inputs in `dt`; its backward sees `stored` as the output.
                    let ring = |dt: DType, stored: Option<&[f32]>| {
                        let qt = tensor(bk, &q, &[b, tl, h * 3 * d], dt);
                        let mut o = bk.zeros(&[b, tl, h * d], dt).unwrap();
                        let mut l = bk.zeros(&[b, h, tl], DType::F32).unwrap();
                        ring_attention_forward(bk, &ctx, &qt, &mut o, &mut l, spec(tl)).unwrap();
                        assert_eq!((o.dtype(), l.dtype()), (dt, DType::F32), "forward result dtypes");
                        let o_in = stored.map_or_else(|| host(bk, &o), <[f32]>::to_vec);
                        let o_in = tensor(bk, &o_in, &[b, tl, h * d], dt);
                        let mut dq = bk.zeros(&[b, tl, h * 3 * d], dt).unwrap();
                        let gt = tensor(bk, &g, &[b, tl, h * d], dt);
                        ring_attention_backward(bk, &ctx, &gt, &qt, &o_in, &l, &mut dq, spec(tl)).unwrap();
                        assert_eq!(dq.dtype(), dt, "backward result dtype");
                        (host(bk, &o), host(bk, &l), host(bk, &dq))
                    };
                    let half = ring(dtype, None);
                    let full = ring(DType::F32, Some(&half.0));
                    (pos, half, full)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let u = if dtype == DType::BF16 { 2f32.powi(-8) } else { 2f32.powi(-11) };
    let lse = &lse;
    for (pos, (o, l, dq), (o32, l32, dq32)) in results {
        let case = format!("{dtype} cp {cp} causal {causal} positions {pos:?}");
        assert!(same_bits(&o, &round(bk, &o32, dtype)), "{case}: output is not the f32 ring's rounded once");
        assert!(same_bits(&l, &l32), "{case}: lse is not the f32 ring's");
        assert!(same_bits(&dq, &round(bk, &dq32, dtype)), "{case}: d_qkv is not the f32 ring's rounded once");
        let want_o = round(bk, &rows(&out, b, t, h * d, &pos), dtype);
        let want_dq = rows(&d_qkv, b, t, h * 3 * d, &pos);
        let want_l: Vec<f32> = (0..b * h).flat_map(|bh| pos.iter().map(move |&p| lse[bh * t + p])).collect();
        let (eo, el, eg) = (max_abs_rel(&o, &want_o), max_abs_rel(&l, &want_l), max_abs_rel(&dq, &want_dq));
        println!("{case}: vs single-rank f32: out {eo:.1e} lse {el:.1e} d_qkv {eg:.1e} (u {u:.1e})");
        let tol = u + 2e-5;
        assert!(eo <= tol && el < 1e-5 && eg <= tol, "{case}: out {eo:.1e}, lse {el:.1e}, d_qkv {eg:.1e} vs u {u:.1e}");
    }
}

#[test]
fn half_ring_attention_is_the_f32_ring_rounded_once() {
    for dtype in [DType::BF16, DType::F16] {
        for cp in [2, 3] {
            check(dtype, cp, true);
            check(dtype, cp, false);
        }
    }
}

#[test]
fn half_rotary_per_chunk_is_the_whole_sequence_rotated() {
    let (b, h, d) = (2, 2, 8);
    let bk = backend();
    let bk = bk.as_ref();
    for dtype in [DType::BF16, DType::F16] {
        for cp in [2, 3] {
            let t = 4 * cp;
            let width = h * 3 * d;
            let spec = |batch, seq| RotarySpec {
                batch,
                seq,
                heads: h,
                head_dim: d,
                rotary_dim: d,
                base: 10000.0,
                interleaved: false,
                position_offset: 0,
            };
            let qkv = round(bk, &lcg(b * t * width, 5), dtype);
            let comms = LocalCommunicator::world(cp, std::time::Duration::from_secs(60));
            let grid = RankGrid::new(cp, 1, cp, 1).unwrap();
            for inverse in [false, true] {
                let mut whole = tensor(bk, &qkv, &[b, t, width], dtype);
                bk.rotary(&mut whole, spec(b, t), inverse).unwrap();
                let whole = host(bk, &whole);
                for (r, comm) in comms.iter().enumerate() {
                    let ctx = grid.context(r, comm.clone());
                    let pos = local_positions(t, cp, ctx.cp_rank);
                    let mut mine = tensor(bk, &rows(&qkv, b, t, width, &pos), &[b, pos.len(), width], dtype);
                    rotary_context_parallel(bk, &ctx, &mut mine, spec(b, pos.len()), inverse).unwrap();
                    assert_eq!(mine.dtype(), dtype, "rotary changed the dtype");
                    let want = rows(&whole, b, t, width, &pos);
                    assert!(
                        same_bits(&host(bk, &mine), &want),
                        "{dtype} cp {cp} rank {r} inverse {inverse}: not the whole sequence's rotation at {pos:?}"
                    );
                }
            }
        }
    }
}
