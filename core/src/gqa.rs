//! Grouped-query attention layouts (SPEC §4.2 with `ng < np`).
//!
//! `linear_qkv` produces Megatron's fused GQA layout `(N, ng, r + 2, hn)` with `r = np / ng`:
//! per query group its `r` query heads, then the group's key and value. The attention ops take
//! the per-head layout `(N, np, 3, hn)`. [`gqa_expand_host`] copies every group's k/v to each
//! of its `r` heads; [`gqa_reduce_host`] is its adjoint (the backward): query gradients move
//! back, key/value gradients of the `r` heads of a group are summed. These host versions are
//! the reference and the default of [`crate::AttentionOps::gqa_expand`]/[`crate::AttentionOps::gqa_reduce`].

use crate::Result;
use anyhow::bail;

/// Sizes of one GQA relayout; `rows` is the number of token rows `N` (e.g. `B*T`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GqaSpec {
    pub rows: usize,
    /// Query groups on this rank (`ng / tp`).
    pub groups: usize,
    /// Query heads per group (`np / ng`).
    pub heads_per_group: usize,
    pub head_dim: usize,
}

impl GqaSpec {
    /// Elements of the grouped layout `(N, ng, r + 2, hn)`.
    pub fn grouped_len(&self) -> usize {
        self.rows * self.groups * (self.heads_per_group + 2) * self.head_dim
    }

    /// Elements of the per-head layout `(N, ng * r, 3, hn)`.
    pub fn expanded_len(&self) -> usize {
        self.rows * self.groups * self.heads_per_group * 3 * self.head_dim
    }

    fn check(&self, op: &str, grouped: usize, expanded: usize) -> Result<()> {
        if grouped != self.grouped_len() || expanded != self.expanded_len() {
            bail!(
                "`{op}`: {self:?} needs a grouped tensor of {} and an expanded one of {} elements, got {grouped} and {expanded}",
                self.grouped_len(),
                self.expanded_len()
            );
        }
        Ok(())
    }
}

/// `(N, ng, r+2, hn)` → `(N, ng*r, 3, hn)`: head `g*r + j` gets query `j` of group `g` and the
/// group's key and value.
pub fn gqa_expand_host(src: &[f32], dst: &mut [f32], spec: GqaSpec) -> Result<()> {
    spec.check("gqa_expand", src.len(), dst.len())?;
    let GqaSpec { groups, heads_per_group: r, head_dim: hn, .. } = spec;
    let (src_row, dst_row) = ((r + 2) * hn * groups, 3 * hn * r * groups);
    if src_row == 0 {
        return Ok(());
    }
    for (s, d) in src.chunks_exact(src_row).zip(dst.chunks_exact_mut(dst_row)) {
        for g in 0..groups {
            let sg = &s[g * (r + 2) * hn..(g + 1) * (r + 2) * hn];
            let (k, v) = (&sg[r * hn..(r + 1) * hn], &sg[(r + 1) * hn..]);
            for j in 0..r {
                let dh = &mut d[(g * r + j) * 3 * hn..(g * r + j + 1) * 3 * hn];
                dh[..hn].copy_from_slice(&sg[j * hn..(j + 1) * hn]);
                dh[hn..2 * hn].copy_from_slice(k);
                dh[2 * hn..].copy_from_slice(v);
            }
        }
    }
    Ok(())
}

/// The adjoint of [`gqa_expand_host`]: `d_src` (overwritten) from `d_dst`.
pub fn gqa_reduce_host(d_dst: &[f32], d_src: &mut [f32], spec: GqaSpec) -> Result<()> {
    spec.check("gqa_reduce", d_src.len(), d_dst.len())?;
    let GqaSpec { groups, heads_per_group: r, head_dim: hn, .. } = spec;
    let (src_row, dst_row) = ((r + 2) * hn * groups, 3 * hn * r * groups);
    if src_row == 0 {
        return Ok(());
    }
    for (s, d) in d_src.chunks_exact_mut(src_row).zip(d_dst.chunks_exact(dst_row)) {
        for g in 0..groups {
            let sg = &mut s[g * (r + 2) * hn..(g + 1) * (r + 2) * hn];
            sg[r * hn..].fill(0.0);
            for j in 0..r {
                let dh = &d[(g * r + j) * 3 * hn..(g * r + j + 1) * 3 * hn];
                sg[j * hn..(j + 1) * hn].copy_from_slice(&dh[..hn]);
                // Summed in head order j = 0..r: deterministic.
                for i in 0..hn {
                    sg[r * hn + i] += dh[hn + i];
                    sg[(r + 1) * hn + i] += dh[2 * hn + i];
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expand_places_groups_and_reduce_is_its_adjoint() {
        let spec = GqaSpec { rows: 2, groups: 2, heads_per_group: 3, head_dim: 2 };
        let src: Vec<f32> = (0..spec.grouped_len()).map(|i| i as f32).collect();
        let mut dst = vec![0.0; spec.expanded_len()];
        gqa_expand_host(&src, &mut dst, spec).unwrap();
        // Row 0, group 1 = src[10..20]: q0 = [10, 11], k = [16, 17], v = [18, 19]; head 3 is
        // group 1's first query head.
        assert_eq!(&dst[3 * 6..4 * 6], &[10.0, 11.0, 16.0, 17.0, 18.0, 19.0]);
        // Adjoint: <expand(x), y> == <x, reduce(y)> for arbitrary y.
        let y: Vec<f32> = (0..spec.expanded_len()).map(|i| ((i * 7919) % 13) as f32 - 6.0).collect();
        let mut ry = vec![1e9; spec.grouped_len()];
        gqa_reduce_host(&y, &mut ry, spec).unwrap();
        let lhs: f64 = dst.iter().zip(&y).map(|(a, b)| (*a as f64) * (*b as f64)).sum();
        let rhs: f64 = src.iter().zip(&ry).map(|(a, b)| (*a as f64) * (*b as f64)).sum();
        assert_eq!(lhs, rhs);
        assert!(gqa_expand_host(&src[1..], &mut dst, spec).is_err());
    }
}
