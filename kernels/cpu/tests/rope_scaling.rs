//! `rotary_scaled` (Llama-3.1 and linear frequency scaling) against a naive f64 rotation with
//! the frequencies of `RopeScaling::inv_freq` (1e-6: the same f32 angles, f32 vs f64
//! rotation), both pair layouts; `RopeScaling::None` is bit-identical to `rotary`.

mod common;

use common::*;
use megatron_core::{RopeScaling, RotaryOps, RotarySpec};

fn naive(x: &[f32], s: &RotarySpec, inv_freq: &[f32], inverse: bool) -> Vec<f64> {
    let mut y: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let half = inv_freq.len();
    for b in 0..s.batch {
        for t in 0..s.seq {
            let pos = (s.position_offset + t) as f32;
            for h in 0..s.heads {
                for slot in 0..2 {
                    let o = ((b * s.seq + t) * s.heads + h) * 3 * s.head_dim + slot * s.head_dim;
                    for (i, &f) in inv_freq.iter().enumerate() {
                        let theta = (pos * f) as f64;
                        let sin = if inverse { -theta.sin() } else { theta.sin() };
                        let (a, c) = if s.interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
                        let (x1, x2) = (y[o + a], y[o + c]);
                        y[o + a] = x1 * theta.cos() - x2 * sin;
                        y[o + c] = x2 * theta.cos() + x1 * sin;
                    }
                }
            }
        }
    }
    y
}

#[test]
fn scaled_rotary_matches_naive_reference_and_inverts() {
    let be = backend();
    let mut rng = Rng::new(5);
    let scalings = [
        RopeScaling::Llama3 {
            factor: 4.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 32,
        },
        RopeScaling::Linear { factor: 2.5 },
    ];
    for scaling in scalings {
        for interleaved in [false, true] {
            let s = RotarySpec {
                batch: 2,
                seq: 7,
                heads: 2,
                head_dim: 10,
                rotary_dim: 8,
                base: 100.0,
                interleaved,
                position_offset: 40,
            };
            let x = rng.vec(2 * 7 * 2 * 3 * 10, 1.0);
            let mut t = tensor(&be, &x, &[2, 7, 2, 3, 10]);
            be.rotary_scaled(&mut t, s, scaling, false).unwrap();
            let inv = scaling.inv_freq(s.base, s.rotary_dim);
            assert_close("rotary_scaled", &host(&be, &t), &naive(&x, &s, &inv, false), 1e-6, 1e-6);
            // The scaling matters at these positions (a no-op scaling would fail here).
            let mut plain = tensor(&be, &x, &[2, 7, 2, 3, 10]);
            be.rotary(&mut plain, s, false).unwrap();
            assert!(host(&be, &plain).iter().zip(host(&be, &t)).any(|(a, b)| (a - b).abs() > 1e-3));
            be.rotary_scaled(&mut t, s, scaling, true).unwrap();
            assert_close("rotary_scaled inverse", &host(&be, &t), &widen(&x), 1e-6, 1e-6);
        }
    }
    // No scaling: exactly the plain kernel.
    let s = RotarySpec {
        batch: 1,
        seq: 3,
        heads: 1,
        head_dim: 4,
        rotary_dim: 4,
        base: 1e4,
        interleaved: false,
        position_offset: 2,
    };
    let x = rng.vec(36, 1.0);
    let (mut a, mut b) = (tensor(&be, &x, &[1, 3, 1, 3, 4]), tensor(&be, &x, &[1, 3, 1, 3, 4]));
    be.rotary(&mut a, s, false).unwrap();
    be.rotary_scaled(&mut b, s, RopeScaling::None, false).unwrap();
    assert_eq!(host(&be, &a), host(&be, &b));
    let bad = RopeScaling::Linear { factor: -1.0 };
    assert!(be.rotary_scaled(&mut b, s, bad, false).is_err());
}
