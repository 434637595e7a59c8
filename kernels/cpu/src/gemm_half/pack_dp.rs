//! The `dp` (`vdpbf16ps`) panel packer for bf16 operands, moving whole k-pairs per step.
//!
//! A `dp` panel of width `w` stores pair `p` of lane `x` at `[(p·w + x)·2, +2)`: the two bf16
//! of k = 2p and 2p+1 side by side. The generic packer ([`super::pack`]) computes that position
//! and bounds-checks the source once per element; packing was a fifth of the small GEMMs of a
//! GPT-2 step. Here each source layout gets a loop over whole pairs:
//! * k contiguous in the source (`A` `[m, k]`, `B^T` `[n, k]`): a lane's pairs are consecutive
//!   bf16 of one source row, copied to positions `w` pairs apart;
//! * k strided (`A^T` `[k, m]`, `B` `[k, n]`): a pair of source rows (k = 2p, 2p+1) is
//!   interleaved element by element into one contiguous run of the panel (vectorised).
//!
//! The output is identical to the generic packer's (zero padding of short panels and of an odd
//! last k included): `tests::dp_packer_equals_generic`.

use megatron_core::half::bf16;

/// Packs lanes `[x0, x0 + cnt)` (`cnt ≤ w`) × k `[k0, k0 + kc)` of `src` into one `dp` panel
/// of width `w`. Element `(x, kk)` of the operand is `src[x·ld + kk]` when `k_contig`, else
/// `src[kk·ld + x]`. `out` holds `ceil(kc/2)·2·w` elements.
#[allow(clippy::too_many_arguments)]
#[inline]
pub(super) fn pack_dp(
    src: &[bf16],
    k_contig: bool,
    ld: usize,
    x0: usize,
    cnt: usize,
    k0: usize,
    kc: usize,
    w: usize,
    out: &mut [u16],
) {
    let kp = kc.div_ceil(2);
    let out = &mut out[..kp * 2 * w];
    if cnt < w || kc % 2 == 1 {
        out.fill(0);
    }
    let full = kc / 2; // whole pairs
    if k_contig {
        for x in 0..cnt {
            let row = &src[(x0 + x) * ld + k0..(x0 + x) * ld + k0 + kc];
            for (pair, o) in row.chunks_exact(2).zip(out.chunks_exact_mut(2 * w)) {
                o[2 * x] = pair[0].to_bits();
                o[2 * x + 1] = pair[1].to_bits();
            }
            if kc % 2 == 1 {
                out[(full * w + x) * 2] = row[kc - 1].to_bits();
            }
        }
    } else {
        for (p, o) in out.chunks_exact_mut(2 * w).enumerate().take(full) {
            let r0 = &src[(k0 + 2 * p) * ld + x0..(k0 + 2 * p) * ld + x0 + cnt];
            let r1 = &src[(k0 + 2 * p + 1) * ld + x0..(k0 + 2 * p + 1) * ld + x0 + cnt];
            for ((o, a), b) in o.chunks_exact_mut(2).zip(r0).zip(r1) {
                o[0] = a.to_bits();
                o[1] = b.to_bits();
            }
        }
        if kc % 2 == 1 {
            let r = &src[(k0 + kc - 1) * ld + x0..(k0 + kc - 1) * ld + x0 + cnt];
            let o = &mut out[full * 2 * w..];
            for (o, a) in o.chunks_exact_mut(2).zip(r) {
                o[0] = a.to_bits();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::pack::{pack_a_panel, pack_b_panel};
    use super::super::{MR, NR};
    use super::*;

    /// Every layout, full and short panels, even and odd kc, an offset k block: the same bits as
    /// the generic packer (the reference).
    #[test]
    fn dp_packer_equals_generic() {
        let (m, n, k) = (19, 101, 37);
        let a: Vec<bf16> = (0..m * k).map(|i| bf16::from_f32(i as f32 * 0.37 - 9.0)).collect();
        let b: Vec<bf16> = (0..k * n).map(|i| bf16::from_f32(i as f32 * -0.11 + 3.0)).collect();
        for trans in [false, true] {
            for (k0, kc) in [(0usize, 37usize), (4, 16), (3, 9), (36, 1)] {
                for i0 in [0, 8, 16] {
                    let len = kc.div_ceil(2) * 2 * MR;
                    let (mut want, mut got) = (vec![7u16; len], vec![9u16; len]);
                    pack_a_panel::<u16, [bf16], true>(&a, trans, m, k, i0, k0, kc, &mut want);
                    let ld = if trans { m } else { k };
                    pack_dp(&a, !trans, ld, i0, MR.min(m - i0), k0, kc, MR, &mut got);
                    assert_eq!(got, want, "A trans={trans} k0={k0} kc={kc} i0={i0}");
                }
                for j0 in [0, NR, 2 * NR] {
                    let len = kc.div_ceil(2) * 2 * NR;
                    let (mut want, mut got) = (vec![7u16; len], vec![9u16; len]);
                    pack_b_panel::<u16, [bf16], true>(&b, trans, k, n, k0, kc, j0, &mut want);
                    let ld = if trans { k } else { n };
                    pack_dp(&b, trans, ld, j0, NR.min(n - j0), k0, kc, NR, &mut got);
                    assert_eq!(got, want, "B trans={trans} k0={k0} kc={kc} j0={j0}");
                }
            }
        }
    }
}
