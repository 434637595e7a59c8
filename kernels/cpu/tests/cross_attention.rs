//! Cross-attention parity: the tiled kernel against the explicit-score reference (forward,
//! backward and the bias gradient) with padding on both sides, causal masks, a position bias,
//! dropout and lengths that are not multiples of the tile; the reference backward against f64
//! finite differences; the kernel against the self-attention kernel where both apply.

mod common;
use common::*;
use megatron_core::{AttentionOps, AttentionSpec, CrossAttentionSpec, ElementwiseOps, PaddedAttentionOps};
use megatron_cpu::reference as r;

#[allow(clippy::too_many_arguments)]
fn spec(
    batch: usize,
    tq: usize,
    tk: usize,
    heads: usize,
    hd: usize,
    causal: bool,
    scale: f32,
    p: f32,
) -> CrossAttentionSpec {
    CrossAttentionSpec {
        batch,
        q_len: tq,
        kv_len: tk,
        heads,
        head_dim: hd,
        causal,
        scale,
        dropout_p: p,
        dropout_seed: 77,
    }
}

/// Kernel vs reference: outputs and lse to 2e-5 abs + 1e-4 rel (fp32 tiles vs f64), gradients
/// (sums of products over up to 150 positions) to 1e-4 abs + 1e-3 rel. `d_bias` starts at 0.5
/// everywhere to check that it accumulates.
fn check(s: CrossAttentionSpec, q_valid: &[i32], kv_valid: &[i32], with_bias: bool, seed: u64) {
    let be = backend();
    let mut rng = Rng::new(seed);
    let (x_q, x_kv, g) = (rng.vec(s.q_numel(), 1.5), rng.vec(s.kv_numel(), 1.5), rng.vec(s.q_numel(), 1.0));
    let bias_v = if with_bias { rng.vec(s.bias_numel(), 2.0) } else { vec![] };
    let q = tensor(&be, &x_q, &[s.batch, s.q_len, s.heads, s.head_dim]);
    let kv = tensor(&be, &x_kv, &[s.batch, s.kv_len, s.heads, 2, s.head_dim]);
    let qv = (!q_valid.is_empty()).then(|| ids(&be, q_valid));
    let kvv = (!kv_valid.is_empty()).then(|| ids(&be, kv_valid));
    let bias = with_bias.then(|| tensor(&be, &bias_v, &[s.heads, s.q_len, s.kv_len]));
    let mut out = zeros(&be, &[s.q_numel()]);
    be.fill(&mut out, f32::NAN).unwrap(); // forward must overwrite every element
    let mut lse = zeros(&be, &[s.lse_numel()]);
    be.cross_attention_forward(&q, &kv, qv.as_ref(), kvv.as_ref(), bias.as_ref(), &mut out, &mut lse, s).unwrap();
    let bias64 = widen(&bias_v);
    let (want_out, want_lse) = r::cross_attention_forward(&widen(&x_q), &widen(&x_kv), q_valid, kv_valid, &bias64, &s);
    assert_close("cross out", &host(&be, &out), &want_out, 2e-5, 1e-4);
    assert_close("cross lse", &host(&be, &lse), &want_lse, 2e-5, 1e-4);

    let d_out = tensor(&be, &g, &[s.q_numel()]);
    let (mut dq, mut dkv) = (zeros(&be, &[s.q_numel()]), zeros(&be, &[s.kv_numel()]));
    be.fill(&mut dq, f32::NAN).unwrap();
    be.fill(&mut dkv, f32::NAN).unwrap();
    let mut db = zeros(&be, &[s.bias_numel()]);
    be.fill(&mut db, 0.5).unwrap();
    be.cross_attention_backward(
        &d_out,
        &q,
        &kv,
        qv.as_ref(),
        kvv.as_ref(),
        bias.as_ref(),
        &out,
        &lse,
        &mut dq,
        &mut dkv,
        Some(&mut db),
        s,
    )
    .unwrap();
    let (wq, wkv, wb) =
        r::cross_attention_backward(&widen(&g), &widen(&x_q), &widen(&x_kv), q_valid, kv_valid, &bias64, &s);
    assert_close("cross d_q", &host(&be, &dq), &wq, 1e-4, 1e-3);
    assert_close("cross d_kv", &host(&be, &dkv), &wkv, 1e-4, 1e-3);
    let wb: Vec<f64> = wb.iter().map(|v| v + 0.5).collect();
    assert_close("cross d_bias", &host(&be, &db), &wb, 1e-4, 1e-3);

    // Without d_bias the (b, h)-parallel schedule gives the same d_q/d_kv bit for bit.
    let (mut dq2, mut dkv2) = (zeros(&be, &[s.q_numel()]), zeros(&be, &[s.kv_numel()]));
    be.cross_attention_backward(
        &d_out,
        &q,
        &kv,
        qv.as_ref(),
        kvv.as_ref(),
        bias.as_ref(),
        &out,
        &lse,
        &mut dq2,
        &mut dkv2,
        None,
        s,
    )
    .unwrap();
    assert_eq!(host(&be, &dq), host(&be, &dq2));
    assert_eq!(host(&be, &dkv), host(&be, &dkv2));
}

#[test]
fn cross_multi_tile_padding_and_bias() {
    // Tq = 70 (two query tiles), Tk = 150 (three key tiles, the last partial), padding on both.
    check(spec(2, 70, 150, 2, 8, false, 0.35, 0.0), &[70, 33], &[150, 65], true, 1);
}

#[test]
fn cross_no_masks_no_bias() {
    check(spec(1, 5, 9, 3, 4, false, 0.5, 0.0), &[], &[], false, 2);
}

#[test]
fn decoder_self_attention_causal_with_bias_and_padding() {
    // T5 decoder self-attention with relative bias: Tq = Tk, causal, padded rows.
    check(spec(2, 67, 67, 2, 8, true, 1.0, 0.0), &[67, 40], &[67, 40], true, 3);
}

#[test]
fn dropout_and_empty_rows() {
    // Row 1 has no keys at all, row 2 no queries: zero outputs, zero gradients.
    check(spec(3, 9, 11, 2, 3, false, 0.6, 0.3), &[9, 9, 0], &[11, 0, 5], true, 4);
    check(spec(2, 13, 7, 1, 2, true, 0.6, 0.2), &[13, 4], &[7, 7], true, 5);
}

/// Reference backward vs central differences of the reference forward in f64 (h = 1e-5),
/// for q, kv and the bias, causal and not, with padding and dropout.
#[test]
fn reference_backward_matches_finite_differences() {
    for (causal, p) in [(false, 0.0), (true, 0.0), (false, 0.3)] {
        let s = spec(2, 4, 5, 2, 3, causal, 0.7, p);
        let (qv, kvv) = ([4, 3], [5, 2]);
        let mut rng = Rng::new(9);
        let q = widen(&rng.vec(s.q_numel(), 1.0));
        let kv = widen(&rng.vec(s.kv_numel(), 1.0));
        let bias = widen(&rng.vec(s.bias_numel(), 1.0));
        let g = widen(&rng.vec(s.q_numel(), 1.0));
        let (aq, akv, ab) = r::cross_attention_backward(&g, &q, &kv, &qv, &kvv, &bias, &s);
        let what = format!("causal={causal} p={p}");
        let f = |q: &[f64], kv: &[f64], b: &[f64]| dot(&r::cross_attention_forward(q, kv, &qv, &kvv, b, &s).0, &g);
        assert_close64(&format!("d_q {what}"), &aq, &finite_diff(&q, 1e-5, |x| f(x, &kv, &bias)), 1e-7, 1e-6);
        assert_close64(&format!("d_kv {what}"), &akv, &finite_diff(&kv, 1e-5, |x| f(&q, x, &bias)), 1e-7, 1e-6);
        assert_close64(&format!("d_bias {what}"), &ab, &finite_diff(&bias, 1e-5, |x| f(&q, &kv, x)), 1e-7, 1e-6);
    }
}

/// With q, k, v cut from one fused QKV, no padding and no bias, cross-attention is the
/// self-attention op: same outputs and gradients (1e-5: both fp32, same tiling).
#[test]
fn matches_self_attention_kernel() {
    let be = backend();
    let (b, t, h, hd) = (2, 80, 2, 8);
    let mut rng = Rng::new(12);
    let x = rng.vec(b * t * h * 3 * hd, 1.0);
    let g = rng.vec(b * t * h * hd, 1.0);
    let (mut q, mut kv) = (vec![], vec![]);
    for row in x.chunks_exact(3 * hd) {
        q.extend_from_slice(&row[..hd]);
        kv.extend_from_slice(&row[hd..]);
    }
    for causal in [false, true] {
        let sa = AttentionSpec {
            batch: b,
            seq: t,
            heads: h,
            head_dim: hd,
            causal,
            scale: 0.3,
            dropout_p: 0.0,
            dropout_seed: 0,
        };
        let (mut o1, mut l1) = (zeros(&be, &[b * t * h * hd]), zeros(&be, &[b * h * t]));
        let qkv = tensor(&be, &x, &[x.len()]);
        be.attention_forward(&qkv, &mut o1, &mut l1, sa).unwrap();
        let mut d_qkv = zeros(&be, &[x.len()]);
        let gt = tensor(&be, &g, &[g.len()]);
        be.attention_backward(&gt, &qkv, &o1, &l1, &mut d_qkv, sa).unwrap();

        let s = spec(b, t, t, h, hd, causal, 0.3, 0.0);
        let (qt, kvt) = (tensor(&be, &q, &[q.len()]), tensor(&be, &kv, &[kv.len()]));
        let (mut o2, mut l2) = (zeros(&be, &[b * t * h * hd]), zeros(&be, &[b * h * t]));
        be.cross_attention_forward(&qt, &kvt, None, None, None, &mut o2, &mut l2, s).unwrap();
        let (mut dq, mut dkv) = (zeros(&be, &[q.len()]), zeros(&be, &[kv.len()]));
        be.cross_attention_backward(&gt, &qt, &kvt, None, None, None, &o2, &l2, &mut dq, &mut dkv, None, s).unwrap();
        assert_close("out vs self-attention", &host(&be, &o2), &widen(&host(&be, &o1)), 1e-5, 1e-5);
        let dself = host(&be, &d_qkv);
        let (mut wq, mut wkv) = (vec![], vec![]);
        for row in dself.chunks_exact(3 * hd) {
            wq.extend_from_slice(&row[..hd]);
            wkv.extend_from_slice(&row[hd..]);
        }
        assert_close("d_q vs self-attention", &host(&be, &dq), &widen(&wq), 1e-5, 1e-5);
        assert_close("d_kv vs self-attention", &host(&be, &dkv), &widen(&wkv), 1e-5, 1e-5);
    }
}

#[test]
fn rejects_bad_shapes_and_lengths() {
    let be = backend();
    let s = spec(2, 4, 6, 2, 4, false, 0.5, 0.0);
    let q = zeros(&be, &[s.q_numel()]);
    let kv = zeros(&be, &[s.kv_numel()]);
    let (mut out, mut lse) = (zeros(&be, &[s.q_numel()]), zeros(&be, &[s.lse_numel()]));
    let bad_kv = zeros(&be, &[s.kv_numel() - 1]);
    let e = be.cross_attention_forward(&q, &bad_kv, None, None, None, &mut out, &mut lse, s).unwrap_err().to_string();
    assert!(e.contains("cross_attention_forward") && e.contains("kv"), "{e}");
    let long = ids(&be, &[4, 7]);
    let e =
        be.cross_attention_forward(&q, &kv, None, Some(&long), None, &mut out, &mut lse, s).unwrap_err().to_string();
    assert!(e.contains("kv_valid") && e.contains("7"), "{e}");
    let bad_bias = zeros(&be, &[2, 4, 5]);
    let e = be
        .cross_attention_forward(&q, &kv, None, None, Some(&bad_bias), &mut out, &mut lse, s)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bias"), "{e}");
}
