//! Attention and rotary parity: the tiled flash kernel against the explicit-score reference
//! (forward and backward, causal and full, dropout on and off, T not a multiple of the tile),
//! and the reference backward against f64 finite differences.

mod common;
use common::*;
use megatron_core::{AttentionOps, AttentionSpec, ElementwiseOps, MemoryOps, RotaryOps, RotarySpec};
use megatron_cpu::reference as r;

fn spec(batch: usize, seq: usize, heads: usize, head_dim: usize, causal: bool, p: f32) -> AttentionSpec {
    AttentionSpec {
        batch,
        seq,
        heads,
        head_dim,
        causal,
        scale: 1.0 / (head_dim as f32).sqrt(),
        dropout_p: p,
        dropout_seed: 1234,
    }
}

/// Kernel vs reference. fp32 tiles with an online softmax against f64: outputs and lse agree to
/// 2e-5 abs + 1e-4 rel, gradients (sums over T of products) to 1e-4 abs + 1e-3 rel.
fn check_parity(s: AttentionSpec, seed: u64) {
    let be = backend();
    let mut rng = Rng::new(seed);
    let n_qkv = s.batch * s.seq * s.heads * 3 * s.head_dim;
    let n_out = s.batch * s.seq * s.heads * s.head_dim;
    let x = rng.vec(n_qkv, 1.5);
    let g = rng.vec(n_out, 1.0);
    let qkv = tensor(&be, &x, &[s.batch, s.seq, s.heads, 3, s.head_dim]);
    let mut out = zeros(&be, &[s.batch, s.seq, s.heads * s.head_dim]);
    let mut lse = zeros(&be, &[s.batch, s.heads, s.seq]);
    be.attention_forward(&qkv, &mut out, &mut lse, s).unwrap();
    let (want_out, want_lse) = r::attention_forward(&widen(&x), &s);
    assert_close("attention out", &host(&be, &out), &want_out, 2e-5, 1e-4);
    assert_close("attention lse", &host(&be, &lse), &want_lse, 2e-5, 1e-4);

    let d_out = tensor(&be, &g, &[s.batch, s.seq, s.heads * s.head_dim]);
    let mut d_qkv = zeros(&be, &[n_qkv]);
    be.fill(&mut d_qkv, f32::NAN).unwrap(); // backward must overwrite every element
    be.attention_backward(&d_out, &qkv, &out, &lse, &mut d_qkv, s).unwrap();
    let want = r::attention_backward(&widen(&g), &widen(&x), &s);
    assert_close("attention d_qkv", &host(&be, &d_qkv), &want, 1e-4, 1e-3);
}

#[test]
fn causal_multi_tile_with_remainder() {
    // T = 150 = 2·64 + 22: full tiles, a partial tile and diagonal tiles.
    check_parity(spec(2, 150, 2, 8, true, 0.0), 1);
}

#[test]
fn full_attention_multi_tile() {
    check_parity(spec(1, 70, 3, 16, false, 0.0), 2);
}

#[test]
fn causal_with_dropout() {
    check_parity(spec(2, 67, 2, 8, true, 0.2), 3);
}

#[test]
fn tiny_shapes() {
    check_parity(spec(1, 1, 1, 1, true, 0.0), 4);
    check_parity(spec(3, 5, 1, 3, false, 0.5), 5);
}

/// Reference backward vs central differences of the reference forward (f64, h = 1e-5; the
/// O(h²) truncation error is ~1e-9 here), with and without dropout (same mask every call).
#[test]
fn reference_backward_matches_finite_differences() {
    for (causal, p) in [(true, 0.0), (false, 0.0), (true, 0.3)] {
        let s = spec(1, 6, 2, 3, causal, p);
        let mut rng = Rng::new(9);
        let x = widen(&rng.vec(6 * 2 * 3 * 3, 1.0));
        let g = widen(&rng.vec(6 * 2 * 3, 1.0));
        let fd = finite_diff(&x, 1e-5, |x| dot(&r::attention_forward(x, &s).0, &g));
        let an = r::attention_backward(&g, &x, &s);
        assert_close64(&format!("reference attention grad causal={causal} p={p}"), &an, &fd, 1e-7, 1e-6);
    }
}

/// The kernel's backward against finite differences directly (fp32 kernel vs f64 FD:
/// 1e-4 abs + 1e-3 rel), with dropout, T = 70 spanning two tiles.
#[test]
fn kernel_backward_matches_finite_differences_with_dropout() {
    let s = spec(1, 70, 1, 2, true, 0.25);
    let be = backend();
    let mut rng = Rng::new(10);
    let x = rng.vec(70 * 3 * 2, 1.0);
    let g = rng.vec(70 * 2, 1.0);
    let qkv = tensor(&be, &x, &[70 * 3 * 2]);
    let (mut out, mut lse) = (zeros(&be, &[70 * 2]), zeros(&be, &[70]));
    be.attention_forward(&qkv, &mut out, &mut lse, s).unwrap();
    let mut d_qkv = zeros(&be, &[70 * 3 * 2]);
    be.attention_backward(&tensor(&be, &g, &[70 * 2]), &qkv, &out, &lse, &mut d_qkv, s).unwrap();
    let gw = widen(&g);
    let fd = finite_diff(&widen(&x), 1e-5, |x| dot(&r::attention_forward(x, &s).0, &gw));
    assert_close("kernel attention grad vs FD", &host(&be, &d_qkv), &fd, 1e-4, 1e-3);
}

#[test]
fn attention_rejects_bad_shapes_and_dtypes() {
    let be = backend();
    let s = spec(1, 4, 2, 4, true, 0.0);
    let qkv = zeros(&be, &[1, 4, 2, 3, 3]);
    let (mut out, mut lse) = (zeros(&be, &[1, 4, 8]), zeros(&be, &[1, 2, 4]));
    let e = be.attention_forward(&qkv, &mut out, &mut lse, s).unwrap_err().to_string();
    assert!(e.contains("attention_forward") && e.contains("qkv"), "{e}");
    let bad_p = AttentionSpec { dropout_p: 1.0, ..s };
    let qkv = zeros(&be, &[1, 4, 2, 3, 4]);
    assert!(be.attention_forward(&qkv, &mut out, &mut lse, bad_p).is_err());
    // bf16 qkv/out work (tests/half_dtypes.rs) but the lse statistic must be fp32.
    let half = be.zeros(&[1, 4, 2, 3, 4], megatron_core::DType::BF16).unwrap();
    let mut half_lse = be.zeros(&[1, 2, 4], megatron_core::DType::BF16).unwrap();
    let e = be.attention_forward(&half, &mut out, &mut half_lse, s).unwrap_err().to_string();
    assert!(e.contains("bf16") && e.contains("lse") && e.contains("cpu"), "{e}");
}

/// Rotary vs reference (1e-6 abs: the same f32 angles, f32 vs f64 rotation), both pair
/// layouts; `inverse` undoes the rotation and is the transpose (the backward).
#[test]
fn rotary_matches_reference_and_inverts() {
    let be = backend();
    let mut rng = Rng::new(11);
    for interleaved in [false, true] {
        let s = RotarySpec {
            batch: 2,
            seq: 5,
            heads: 2,
            head_dim: 8,
            rotary_dim: 6,
            base: 10000.0,
            interleaved,
            position_offset: 3,
        };
        let x = rng.vec(2 * 5 * 2 * 3 * 8, 1.0);
        let mut t = tensor(&be, &x, &[2, 5, 2, 3, 8]);
        be.rotary(&mut t, s, false).unwrap();
        let mut want = widen(&x);
        r::rotary(&mut want, &s, false);
        assert_close("rotary", &host(&be, &t), &want, 1e-6, 1e-6);
        be.rotary(&mut t, s, true).unwrap();
        assert_close("rotary inverse", &host(&be, &t), &widen(&x), 1e-6, 1e-6);
        // Transpose check: <R x, y> == <x, R^T y>.
        let y = widen(&rng.vec(x.len(), 1.0));
        let mut ry = y.clone();
        r::rotary(&mut ry, &s, true);
        assert!((dot(&want, &y) - dot(&widen(&x), &ry)).abs() < 1e-9);
    }
    let bad = RotarySpec {
        batch: 1,
        seq: 1,
        heads: 1,
        head_dim: 4,
        rotary_dim: 3,
        base: 1e4,
        interleaved: false,
        position_offset: 0,
    };
    assert!(be.rotary(&mut zeros(&be, &[12]), bad, false).is_err());
}
