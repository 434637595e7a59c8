//! Key-padding-mask attention (`attention_padded_*`, BERT/T5 encoders): the kernel against the
//! explicit masked-score reference (forward and backward, dropout on and off, rows of length
//! T, partial, 1 and 0, T spanning two tiles), the reference backward against finite
//! differences, the kernel backward against finite differences, and a real row against the
//! dense bidirectional attention of its prefix.

mod common;
use common::*;
use megatron_core::{AttentionSpec, ElementwiseOps, PaddedAttentionOps, PaddedAttentionSpec};
use megatron_cpu::reference as r;

fn spec(batch: usize, seq: usize, heads: usize, head_dim: usize, p: f32) -> PaddedAttentionSpec {
    PaddedAttentionSpec {
        batch,
        seq,
        heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        dropout_p: p,
        dropout_seed: 99,
    }
}

fn lengths(be: &megatron_cpu::CpuBackend, l: &[usize]) -> megatron_core::DeviceTensor {
    ids(be, &l.iter().map(|&v| v as i32).collect::<Vec<_>>())
}

/// Kernel vs reference, the tolerances of the dense attention parity test: outputs/lse 2e-5 abs
/// + 1e-4 rel, gradients 1e-4 abs + 1e-3 rel.
fn check_parity(s: PaddedAttentionSpec, lens: &[usize], seed: u64) {
    let be = backend();
    let mut rng = Rng::new(seed);
    let n_qkv = s.batch * s.seq * s.heads * 3 * s.head_dim;
    let n_out = s.batch * s.seq * s.heads * s.head_dim;
    let (x, g) = (rng.vec(n_qkv, 1.5), rng.vec(n_out, 1.0));
    let qkv = tensor(&be, &x, &[s.batch, s.seq, s.heads, 3, s.head_dim]);
    let lt = lengths(&be, lens);
    let mut out = zeros(&be, &[s.batch, s.seq, s.heads * s.head_dim]);
    let mut lse = zeros(&be, &[s.batch, s.heads, s.seq]);
    be.fill(&mut out, f32::NAN).unwrap(); // every element must be written, padding included
    be.attention_padded_forward(&qkv, &lt, &mut out, &mut lse, s).unwrap();
    let (want_out, want_lse) = r::attention_padded_forward(&widen(&x), lens, &s);
    assert_close("padded attention out", &host(&be, &out), &want_out, 2e-5, 1e-4);
    assert_close("padded attention lse", &host(&be, &lse), &want_lse, 2e-5, 1e-4);

    let d_out = tensor(&be, &g, &[s.batch, s.seq, s.heads * s.head_dim]);
    let mut d_qkv = zeros(&be, &[n_qkv]);
    be.fill(&mut d_qkv, f32::NAN).unwrap();
    be.attention_padded_backward(&d_out, &qkv, &lt, &out, &lse, &mut d_qkv, s).unwrap();
    let want = r::attention_padded_backward(&widen(&g), &widen(&x), lens, &s);
    assert_close("padded attention d_qkv", &host(&be, &d_qkv), &want, 1e-4, 1e-3);
}

#[test]
fn mixed_lengths_multi_tile() {
    // T = 70 = 64 + 6: a full row, a row ending in the second tile, one ending in the first,
    // a single token and an empty row.
    check_parity(spec(5, 70, 2, 8, 0.0), &[70, 67, 33, 1, 0], 1);
}

#[test]
fn mixed_lengths_with_dropout() {
    check_parity(spec(3, 40, 3, 4, 0.2), &[40, 17, 5], 2);
}

/// A row of length `len` is exactly the dense (non-causal) attention of its first `len`
/// tokens: the real tokens never see the padding, whatever it holds.
#[test]
fn real_prefix_equals_dense_attention_and_ignores_padding() {
    let be = backend();
    let s = spec(2, 12, 2, 4, 0.0);
    let lens = [12usize, 7];
    let mut rng = Rng::new(3);
    let mut x = rng.vec(2 * 12 * 2 * 3 * 4, 1.0);
    let run = |x: &[f32]| {
        let qkv = tensor(&be, x, &[2, 12, 2, 3, 4]);
        let (mut out, mut lse) = (zeros(&be, &[2, 12, 8]), zeros(&be, &[2, 2, 12]));
        be.attention_padded_forward(&qkv, &lengths(&be, &lens), &mut out, &mut lse, s).unwrap();
        host(&be, &out)
    };
    let before = run(&x);
    // Row 1's prefix through the dense reference.
    let row = 12 * 2 * 3 * 4;
    let dense = AttentionSpec {
        batch: 1,
        seq: 7,
        heads: 2,
        head_dim: 4,
        causal: false,
        scale: s.scale,
        dropout_p: 0.0,
        dropout_seed: 0,
    };
    let (want, _) = r::attention_forward(&widen(&x[row..row + 7 * 24]), &dense);
    assert_close("row 1 prefix vs dense attention", &before[12 * 8..12 * 8 + 7 * 8], &want, 2e-5, 1e-4);
    assert!(before[12 * 8 + 7 * 8..].iter().all(|&v| v == 0.0), "padded queries must output zeros");
    // Scramble row 1's padding: nothing changes.
    for v in &mut x[row + 7 * 24..] {
        *v = 1e3;
    }
    assert_eq!(run(&x), before);
}

/// Reference backward vs central differences of the reference forward (f64, h = 1e-5).
#[test]
fn reference_backward_matches_finite_differences() {
    for p in [0.0, 0.3] {
        let s = spec(2, 5, 2, 3, p);
        let lens = [5usize, 3];
        let mut rng = Rng::new(9);
        let x = widen(&rng.vec(2 * 5 * 2 * 3 * 3, 1.0));
        let g = widen(&rng.vec(2 * 5 * 2 * 3, 1.0));
        let fd = finite_diff(&x, 1e-5, |x| dot(&r::attention_padded_forward(x, &lens, &s).0, &g));
        let an = r::attention_padded_backward(&g, &x, &lens, &s);
        assert_close64(&format!("reference padded attention grad p={p}"), &an, &fd, 1e-7, 1e-6);
    }
}

/// The kernel's backward against finite differences directly (fp32 vs f64: 1e-4 abs + 1e-3 rel).
#[test]
fn kernel_backward_matches_finite_differences() {
    let s = spec(2, 9, 1, 2, 0.25);
    let lens = [9usize, 4];
    let be = backend();
    let mut rng = Rng::new(10);
    let x = rng.vec(2 * 9 * 3 * 2, 1.0);
    let g = rng.vec(2 * 9 * 2, 1.0);
    let qkv = tensor(&be, &x, &[2, 9, 1, 3, 2]);
    let lt = lengths(&be, &lens);
    let (mut out, mut lse) = (zeros(&be, &[2, 9, 2]), zeros(&be, &[2, 1, 9]));
    be.attention_padded_forward(&qkv, &lt, &mut out, &mut lse, s).unwrap();
    let mut d_qkv = zeros(&be, &[x.len()]);
    be.attention_padded_backward(&tensor(&be, &g, &[2, 9, 2]), &qkv, &lt, &out, &lse, &mut d_qkv, s).unwrap();
    let gw = widen(&g);
    let fd = finite_diff(&widen(&x), 1e-5, |x| dot(&r::attention_padded_forward(x, &lens, &s).0, &gw));
    assert_close("kernel padded attention grad vs FD", &host(&be, &d_qkv), &fd, 1e-4, 1e-3);
}

#[test]
fn padded_attention_rejects_bad_lengths_and_shapes() {
    let be = backend();
    let s = spec(2, 4, 1, 2, 0.0);
    let qkv = zeros(&be, &[2, 4, 1, 3, 2]);
    let (mut out, mut lse) = (zeros(&be, &[2, 4, 2]), zeros(&be, &[2, 1, 4]));
    let e = be.attention_padded_forward(&qkv, &ids(&be, &[4, 5]), &mut out, &mut lse, s).unwrap_err().to_string();
    assert!(e.contains("row 1") && e.contains("length 5"), "{e}");
    let e = be.attention_padded_forward(&qkv, &ids(&be, &[4]), &mut out, &mut lse, s).unwrap_err().to_string();
    assert!(e.contains("1 lengths") && e.contains("2 rows"), "{e}");
    let short = zeros(&be, &[2, 4, 1, 3, 1]);
    let e = be.attention_padded_forward(&short, &ids(&be, &[4, 4]), &mut out, &mut lse, s).unwrap_err().to_string();
    assert!(e.contains("qkv"), "{e}");
}
