//! `attention_kv_cache_slots` (continuous batching) parity: every row of a slotted call against
//! the f64 reference of the one-row unslotted op on that slot (prefill and decode with different
//! cached lengths per row, slots out of order, an untouched slot), bit-identity with the
//! unslotted CPU kernel on a one-row cache, and the errors for bad slots/offsets.

mod common;
use common::*;
use megatron_core::{ElementwiseOps, KvCacheAttentionSpec, KvCacheOps};
use megatron_cpu::reference as r;

const H: usize = 2;
const HD: usize = 12;

fn spec(batch: usize, new_tokens: usize, capacity: usize) -> KvCacheAttentionSpec {
    KvCacheAttentionSpec {
        batch,
        new_tokens,
        heads: H,
        head_dim: HD,
        capacity,
        offset: 0,
        scale: 1.0 / (HD as f32).sqrt(),
    }
}

fn check(n_slots: usize, cap: usize, tq: usize, slots: &[usize], offsets: &[usize], seed: u64) {
    let be = backend();
    let mut rng = Rng::new(seed);
    let b = slots.len();
    let s = spec(b, tq, cap);
    let per_slot = cap * H * HD;
    let x = rng.vec(b * tq * H * 3 * HD, 1.5);
    let (k0, v0) = (rng.vec(n_slots * per_slot, 1.0), rng.vec(n_slots * per_slot, 1.0));
    let shape = [n_slots, cap, H, HD];
    let (mut k, mut v) = (tensor(&be, &k0, &shape), tensor(&be, &v0, &shape));
    let mut out = zeros(&be, &[b, tq, H * HD]);
    be.fill(&mut out, f32::NAN).unwrap();
    let qkv = tensor(&be, &x, &[b, tq, H, 3, HD]);
    be.attention_kv_cache_slots(&qkv, &mut k, &mut v, slots, offsets, &mut out, s).unwrap();
    let (got, got_k, got_v) = (host(&be, &out), host(&be, &k), host(&be, &v));
    let (mut want_k, mut want_v) = (widen(&k0), widen(&v0));
    for (row, (&slot, &off)) in slots.iter().zip(offsets).enumerate() {
        let one = KvCacheAttentionSpec { batch: 1, offset: off, ..s };
        let xr = &x[row * tq * H * 3 * HD..][..tq * H * 3 * HD];
        let cache = slot * per_slot..(slot + 1) * per_slot;
        let (o, kr, vr) = r::attention_kv_cache(&widen(xr), &want_k[cache.clone()], &want_v[cache.clone()], &[0], &one);
        assert_close(&format!("row {row} (slot {slot})"), &got[row * tq * H * HD..][..tq * H * HD], &o, 1e-5, 1e-4);
        want_k[cache.clone()].copy_from_slice(&kr);
        want_v[cache].copy_from_slice(&vr);
    }
    // Cache writes are copies; slots not in the call are untouched.
    assert_close("k cache", &got_k, &want_k, 0.0, 0.0);
    assert_close("v cache", &got_v, &want_v, 0.0, 0.0);
}

#[test]
fn decode_rows_with_different_lengths_and_slots_out_of_order() {
    check(5, 16, 1, &[3, 0, 4], &[9, 0, 15], 1);
}

#[test]
fn prefill_of_one_slot_among_others() {
    check(4, 12, 7, &[2], &[0], 2);
    check(4, 12, 3, &[1, 3], &[5, 2], 3);
}

#[test]
fn one_slot_is_bit_identical_to_the_unslotted_kernel() {
    let be = backend();
    let mut rng = Rng::new(4);
    let (cap, tq, off) = (10, 2, 4);
    let x = rng.vec(tq * H * 3 * HD, 1.5);
    let kv0 = rng.vec(cap * H * HD, 1.0);
    let qkv = tensor(&be, &x, &[1, tq, H, 3, HD]);
    let run = |slotted: bool| {
        let (mut k, mut v) = (tensor(&be, &kv0, &[1, cap, H, HD]), tensor(&be, &kv0, &[1, cap, H, HD]));
        let mut out = zeros(&be, &[1, tq, H * HD]);
        if slotted {
            be.attention_kv_cache_slots(&qkv, &mut k, &mut v, &[0], &[off], &mut out, spec(1, tq, cap)).unwrap();
        } else {
            let s = KvCacheAttentionSpec { offset: off, ..spec(1, tq, cap) };
            be.attention_kv_cache(&qkv, &mut k, &mut v, None, &mut out, s).unwrap();
        }
        (host(&be, &out), host(&be, &k))
    };
    let (a, b) = (run(true), run(false));
    assert!(a.0.iter().zip(&b.0).all(|(x, y)| x.to_bits() == y.to_bits()));
    assert_eq!(a.1, b.1);
}

#[test]
fn bad_slots_and_offsets_are_refused() {
    let be = backend();
    let (cap, n_slots) = (8, 2);
    let qkv = zeros(&be, &[2, 1, H, 3, HD]);
    let mut k = zeros(&be, &[n_slots, cap, H, HD]);
    let mut v = zeros(&be, &[n_slots, cap, H, HD]);
    let mut out = zeros(&be, &[2, 1, H * HD]);
    let s = spec(2, 1, cap);
    for (slots, offsets, want) in [
        (&[0, 0][..], &[0, 0][..], "used twice"),
        (&[0, 2][..], &[0, 0][..], "out of range"),
        (&[0, 1][..], &[0, 8][..], "exceed the capacity"),
        (&[0][..], &[0][..], "for 2 rows"),
    ] {
        let e = be.attention_kv_cache_slots(&qkv, &mut k, &mut v, slots, offsets, &mut out, s).unwrap_err();
        assert!(format!("{e:#}").contains(want), "{slots:?} {offsets:?}: {e:#}");
    }
}
