//! `attention_kv_cache` parity: the CPU kernel against the f64 reference (prefill, single-token
//! decode, left-padding key starts, a query with no visible key), and a consistency check that
//! prefill + token-by-token decoding equals the full causal attention of the training kernel.

mod common;
use common::*;
use megatron_core::{AttentionOps, AttentionSpec, ElementwiseOps, KvCacheAttentionSpec, KvCacheOps};
use megatron_cpu::reference as r;

fn spec(batch: usize, new_tokens: usize, offset: usize, capacity: usize) -> KvCacheAttentionSpec {
    KvCacheAttentionSpec { batch, new_tokens, heads: 3, head_dim: 20, capacity, offset, scale: 1.0 / 20f32.sqrt() }
}

/// Kernel vs reference from random caches. fp32 dot products and softmax against f64:
/// 1e-5 abs + 1e-4 rel; the caches must be updated exactly (a copy).
fn check(s: KvCacheAttentionSpec, starts: &[i32], seed: u64) {
    let be = backend();
    let mut rng = Rng::new(seed);
    let cache_n = s.batch * s.capacity * s.heads * s.head_dim;
    let x = rng.vec(s.batch * s.new_tokens * s.heads * 3 * s.head_dim, 1.5);
    let (k0, v0) = (rng.vec(cache_n, 1.0), rng.vec(cache_n, 1.0));
    let qkv = tensor(&be, &x, &[s.batch, s.new_tokens, s.heads, 3, s.head_dim]);
    let shape = [s.batch, s.capacity, s.heads, s.head_dim];
    let (mut k, mut v) = (tensor(&be, &k0, &shape), tensor(&be, &v0, &shape));
    let mut out = zeros(&be, &[s.batch, s.new_tokens, s.heads * s.head_dim]);
    be.fill(&mut out, f32::NAN).unwrap(); // every element must be written
    let key_start = ids(&be, starts);
    be.attention_kv_cache(&qkv, &mut k, &mut v, Some(&key_start), &mut out, s).unwrap();
    let starts_u: Vec<usize> = starts.iter().map(|&k| k as usize).collect();
    let (want, want_k, want_v) = r::attention_kv_cache(&widen(&x), &widen(&k0), &widen(&v0), &starts_u, &s);
    assert_close("kv attention out", &host(&be, &out), &want, 1e-5, 1e-4);
    assert_close("k cache", &host(&be, &k), &want_k, 0.0, 0.0);
    assert_close("v cache", &host(&be, &v), &want_v, 0.0, 0.0);
}

#[test]
fn prefill_from_empty_cache() {
    check(spec(2, 7, 0, 12), &[0, 0], 1);
}

#[test]
fn single_token_decode_after_cached_prefix() {
    check(spec(3, 1, 9, 16), &[0, 0, 0], 2);
}

#[test]
fn left_padding_key_starts_and_a_query_without_keys() {
    // Row 1 starts at key 4: its first new queries (positions 2, 3) see no key and output 0.
    check(spec(2, 5, 2, 10), &[1, 4], 3);
}

#[test]
fn incremental_decoding_equals_full_causal_attention() {
    let be = backend();
    let (b, t, h, hd) = (2, 9, 2, 16);
    let mut rng = Rng::new(4);
    let x = rng.vec(b * t * h * 3 * hd, 1.5);
    let full = AttentionSpec {
        batch: b,
        seq: t,
        heads: h,
        head_dim: hd,
        causal: true,
        scale: 0.25,
        dropout_p: 0.0,
        dropout_seed: 0,
    };
    let mut want = zeros(&be, &[b, t, h * hd]);
    let mut lse = zeros(&be, &[b, h, t]);
    be.attention_forward(&tensor(&be, &x, &[b, t, h, 3, hd]), &mut want, &mut lse, full).unwrap();
    let want = host(&be, &want);

    // Prefill 4 tokens, then one at a time.
    let mut k = zeros(&be, &[b, t, h, hd]);
    let mut v = zeros(&be, &[b, t, h, hd]);
    let mut got = vec![0f32; b * t * h * hd];
    let mut offset = 0;
    for n in [4, 1, 1, 1, 1, 1] {
        let step: Vec<f32> = (0..b)
            .flat_map(|bi| x[(bi * t + offset) * h * 3 * hd..(bi * t + offset + n) * h * 3 * hd].to_vec())
            .collect();
        let s =
            KvCacheAttentionSpec { batch: b, new_tokens: n, heads: h, head_dim: hd, capacity: t, offset, scale: 0.25 };
        let mut out = zeros(&be, &[b, n, h * hd]);
        be.attention_kv_cache(&tensor(&be, &step, &[b, n, h, 3, hd]), &mut k, &mut v, None, &mut out, s).unwrap();
        let out = host(&be, &out);
        for bi in 0..b {
            let dst = (bi * t + offset) * h * hd;
            got[dst..dst + n * h * hd].copy_from_slice(&out[bi * n * h * hd..(bi + 1) * n * h * hd]);
        }
        offset += n;
    }
    let want64: Vec<f64> = want.iter().map(|&w| w as f64).collect();
    assert_close("decoded vs full attention", &got, &want64, 1e-5, 1e-4);
}

#[test]
fn rejects_overflowing_the_cache() {
    let be = backend();
    let s = spec(1, 3, 8, 10);
    let qkv = zeros(&be, &[1, 3, 3, 3, 20]);
    let (mut k, mut v) = (zeros(&be, &[1, 10, 3, 20]), zeros(&be, &[1, 10, 3, 20]));
    let mut out = zeros(&be, &[1, 3, 60]);
    let err = be.attention_kv_cache(&qkv, &mut k, &mut v, None, &mut out, s).unwrap_err().to_string();
    assert!(err.contains("exceed the cache capacity"), "{err}");
}
