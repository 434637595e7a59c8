//! Context-parallel ring attention (`megatron_transformer::context_parallel`, SPEC §5.9) against
//! the single-rank backend attention on the whole sequence: cp ranks as threads, each holding
//! Megatron's load-balanced chunks `r` and `2cp−1−r`, give the reference output, log-sum-exp
//! and q/k/v gradients at those positions (fp32, 1e-5 relative to the largest value), for cp 2
//! and 3, causal and not. The backend attention itself is checked against finite differences in
//! its own crate, so this is the chain: ring = reference = finite differences.

mod common;

use common::{backend, lcg_values, max_abs_rel, rows};
use megatron_comm_local::LocalCommunicator;
use megatron_core::{AttentionSpec, DType, HostBuffer, RankGrid};
use megatron_transformer::context_parallel::{local_positions, ring_attention_backward, ring_attention_forward};

/// The test's inputs: [`lcg_values`] from `seed + 99`.
fn lcg(n: usize, seed: u64) -> Vec<f32> {
    lcg_values(n, seed.wrapping_add(99))
}

fn check(cp: usize, causal: bool) {
    let (b, t, h, d) = (2, 4 * cp, 2, 4);
    let bk = backend();
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
    let qkv = lcg(b * t * h * 3 * d, 1);
    let d_out = lcg(b * t * h * d, 2);
    // Reference on the whole sequence.
    let up = |v: &[f32], shape: &[usize]| bk.from_host(HostBuffer::F32(v.to_vec()), shape).unwrap();
    let qkv_t = up(&qkv, &[b, t, h * 3 * d]);
    let mut out = bk.zeros(&[b, t, h * d], DType::F32).unwrap();
    let mut lse = bk.zeros(&[b, h, t], DType::F32).unwrap();
    bk.attention_forward(&qkv_t, &mut out, &mut lse, spec(t)).unwrap();
    let mut d_qkv = bk.zeros(&[b, t, h * 3 * d], DType::F32).unwrap();
    bk.attention_backward(&up(&d_out, &[b, t, h * d]), &qkv_t, &out, &lse, &mut d_qkv, spec(t)).unwrap();
    let host = |x: &megatron_core::DeviceTensor| bk.to_host(x).unwrap().to_f32_vec();
    let (out, lse, d_qkv) = (host(&out), host(&lse), host(&d_qkv));

    let grid = RankGrid::new(cp, 1, cp, 1).unwrap();
    let comms = LocalCommunicator::world(cp, std::time::Duration::from_secs(60));
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..cp)
            .map(|r| {
                let (ctx, qkv, d_out) = (grid.context(r, comms[r].clone()), &qkv, &d_out);
                s.spawn(move || {
                    let bk = backend();
                    let pos = local_positions(t, cp, ctx.cp_rank);
                    let tl = pos.len();
                    let up = |v: Vec<f32>, shape: &[usize]| bk.from_host(HostBuffer::F32(v), shape).unwrap();
                    let q = up(rows(qkv, b, t, h * 3 * d, &pos), &[b, tl, h * 3 * d]);
                    let mut o = bk.zeros(&[b, tl, h * d], DType::F32).unwrap();
                    let mut l = bk.zeros(&[b, h, tl], DType::F32).unwrap();
                    ring_attention_forward(bk.as_ref(), &ctx, &q, &mut o, &mut l, spec(tl)).unwrap();
                    let g = up(rows(d_out, b, t, h * d, &pos), &[b, tl, h * d]);
                    let mut dq = bk.zeros(&[b, tl, h * 3 * d], DType::F32).unwrap();
                    ring_attention_backward(bk.as_ref(), &ctx, &g, &q, &o, &l, &mut dq, spec(tl)).unwrap();
                    let host = |x: &megatron_core::DeviceTensor| bk.to_host(x).unwrap().to_f32_vec();
                    (pos, host(&o), host(&l), host(&dq))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let lse = &lse;
    for (pos, o, l, dq) in results {
        let want_o = rows(&out, b, t, h * d, &pos);
        let want_dq = rows(&d_qkv, b, t, h * 3 * d, &pos);
        // lse is (B, heads, T): pick the positions per (b, head) row.
        let want_l: Vec<f32> = (0..b * h).flat_map(|bh| pos.iter().map(move |&p| lse[bh * t + p])).collect();
        let (eo, el, eg) = (max_abs_rel(&o, &want_o), max_abs_rel(&l, &want_l), max_abs_rel(&dq, &want_dq));
        println!("cp {cp} causal {causal} positions {pos:?}: out {eo:.1e} lse {el:.1e} d_qkv {eg:.1e}");
        assert!(eo < 1e-5 && el < 1e-5 && eg < 1e-5, "cp {cp} causal {causal}: out {eo}, lse {el}, d_qkv {eg}");
    }
}

#[test]
fn ring_attention_matches_full_attention() {
    for cp in [2, 3] {
        check(cp, true);
        check(cp, false);
    }
    assert_eq!(local_positions(8, 2, 0), [0, 1, 6, 7]);
    assert_eq!(local_positions(8, 2, 1), [2, 3, 4, 5]);
}
