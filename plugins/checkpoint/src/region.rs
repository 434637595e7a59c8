//! Boxes inside n-d row-major tensors: intersection and copy. Used to cut a rank's slice out
//! of stored shards whatever TP layout wrote them.

/// Number of elements of a box (1 for a 0-d scalar).
pub fn volume(extent: &[usize]) -> usize {
    extent.iter().product()
}

/// [`volume`], or `None` when it overflows `usize` (a corrupted shape).
pub fn checked_volume(extent: &[usize]) -> Option<usize> {
    extent.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// Intersection of box `a` (`a_start`, `a_extent`) and box `b`, as `(start, extent)` in the
/// same coordinates; `None` when empty.
pub fn intersect(
    a_start: &[usize],
    a_extent: &[usize],
    b_start: &[usize],
    b_extent: &[usize],
) -> Option<(Vec<usize>, Vec<usize>)> {
    let mut start = Vec::with_capacity(a_start.len());
    let mut extent = Vec::with_capacity(a_start.len());
    for d in 0..a_start.len() {
        let lo = a_start[d].max(b_start[d]);
        let hi = (a_start[d] + a_extent[d]).min(b_start[d] + b_extent[d]);
        if hi <= lo {
            return None;
        }
        start.push(lo);
        extent.push(hi - lo);
    }
    Some((start, extent))
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// A source and destination tensor of raw little-endian bytes, `elem` bytes per element.
pub struct BoxCopy<'a> {
    pub elem: usize,
    pub src: &'a [u8],
    pub src_shape: &'a [usize],
    pub dst_shape: &'a [usize],
}

impl BoxCopy<'_> {
    /// Copies the box of `extent` at `src_start` (in the source) to `dst_start` (in `dst`),
    /// one contiguous run of the last dim at a time. Callers keep boxes in bounds.
    pub fn copy(&self, dst: &mut [u8], src_start: &[usize], dst_start: &[usize], extent: &[usize]) {
        let n = extent.len();
        if extent.contains(&0) {
            return;
        }
        if n == 0 {
            dst[..self.elem].copy_from_slice(&self.src[..self.elem]);
            return;
        }
        let (ss, ds) = (strides(self.src_shape), strides(self.dst_shape));
        let run = extent[n - 1] * self.elem;
        // Index over the outer dims (all but the last).
        let mut idx = vec![0usize; n - 1];
        loop {
            let mut so = src_start[n - 1];
            let mut dof = dst_start[n - 1];
            for d in 0..n - 1 {
                so += (src_start[d] + idx[d]) * ss[d];
                dof += (dst_start[d] + idx[d]) * ds[d];
            }
            let (so, dof) = (so * self.elem, dof * self.elem);
            dst[dof..dof + run].copy_from_slice(&self.src[so..so + run]);
            let mut d = n - 1;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                idx[d] += 1;
                if idx[d] < extent[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Naive reference: element by element through explicit multi-indices.
    fn copy_naive(b: &BoxCopy, dst: &mut [u8], src_start: &[usize], dst_start: &[usize], extent: &[usize]) {
        let total = volume(extent);
        for lin in 0..total {
            let mut rem = lin;
            let mut i = vec![0; extent.len()];
            for d in (0..extent.len()).rev() {
                i[d] = rem % extent[d];
                rem /= extent[d];
            }
            let flat =
                |shape: &[usize], start: &[usize]| (0..shape.len()).fold(0, |acc, d| acc * shape[d] + start[d] + i[d]);
            let (s, t) = (flat(b.src_shape, src_start) * b.elem, flat(b.dst_shape, dst_start) * b.elem);
            dst[t..t + b.elem].copy_from_slice(&b.src[s..s + b.elem]);
        }
    }

    #[test]
    fn box_copy_matches_naive_reference() {
        /// `(src_shape, dst_shape, src_start, dst_start, extent)`.
        type Case<'a> = (&'a [usize], &'a [usize], &'a [usize], &'a [usize], &'a [usize]);
        let cases: &[Case] = &[
            (&[], &[], &[], &[], &[]),
            (&[7], &[5], &[2], &[1], &[3]),
            (&[4, 6], &[4, 3], &[0, 3], &[0, 0], &[4, 3]),
            (&[4, 6], &[2, 6], &[2, 0], &[0, 0], &[2, 6]),
            (&[3, 4, 5], &[5, 4, 6], &[1, 0, 2], &[2, 1, 0], &[2, 3, 3]),
            (&[3, 4], &[3, 4], &[0, 0], &[0, 0], &[0, 4]),
        ];
        for elem in [1, 2, 4] {
            for &(ss, ds, s0, d0, ext) in cases {
                let src: Vec<u8> = (0..volume(ss) * elem).map(|i| (i * 7 + 3) as u8).collect();
                let b = BoxCopy { elem, src: &src, src_shape: ss, dst_shape: ds };
                let mut fast = vec![0xAAu8; volume(ds) * elem];
                let mut naive = fast.clone();
                b.copy(&mut fast, s0, d0, ext);
                copy_naive(&b, &mut naive, s0, d0, ext);
                assert_eq!(fast, naive, "case {ss:?} -> {ds:?} box {ext:?}, elem {elem}");
            }
        }
    }

    #[test]
    fn intersection() {
        assert_eq!(intersect(&[0, 0], &[4, 6], &[2, 3], &[4, 6]), Some((vec![2, 3], vec![2, 3])));
        assert_eq!(intersect(&[0], &[4], &[4], &[2]), None);
        assert_eq!(intersect(&[], &[], &[], &[]), Some((vec![], vec![])));
    }
}
