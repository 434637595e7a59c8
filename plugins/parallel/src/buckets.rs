//! The bucket layout of Megatron's DDP (SPEC §5.6): parameters in **reverse** registration
//! order (≈ the order backward produces their gradients), packed into buckets that close as
//! soon as their element count reaches the bucket size.

/// Megatron's default bucket size in elements: `max(40M, 1M * dp * cp)`.
pub fn default_bucket_size(dp_cp: usize) -> usize {
    40_000_000usize.max(1_000_000 * dp_cp)
}

/// One bucket: parameter indices (into the model's parameter list) in bucket order, the
/// offset of each in the bucket's flat buffer, and the total element count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bucket {
    pub params: Vec<usize>,
    pub offsets: Vec<usize>,
    pub numel: usize,
    /// Element count of each parameter (same order as `params`).
    pub sizes: Vec<usize>,
}

/// Lays out parameters of `numels` (registration order) into buckets of at least
/// `bucket_size` elements (the last may be smaller); `None` puts everything in one bucket
/// (Megatron without `--overlap-grad-reduce`).
pub fn layout_buckets(numels: &[usize], bucket_size: Option<usize>) -> Vec<Bucket> {
    layout_buckets_separate(numels, bucket_size, &vec![false; numels.len()])
}

/// [`layout_buckets`] where every parameter with `separate[i]` gets a bucket of its own
/// (SPEC §5.6: the shared embedding with the distributed optimizer), placed where the
/// reverse walk meets it.
pub fn layout_buckets_separate(numels: &[usize], bucket_size: Option<usize>, separate: &[bool]) -> Vec<Bucket> {
    let limit = bucket_size.unwrap_or(usize::MAX).max(1);
    let empty = || Bucket { params: Vec::new(), offsets: Vec::new(), numel: 0, sizes: Vec::new() };
    let mut buckets = Vec::new();
    let mut cur = empty();
    for i in (0..numels.len()).rev() {
        if separate.get(i).copied().unwrap_or(false) {
            buckets.push(Bucket { params: vec![i], offsets: vec![0], numel: numels[i], sizes: vec![numels[i]] });
            continue;
        }
        cur.params.push(i);
        cur.offsets.push(cur.numel);
        cur.sizes.push(numels[i]);
        cur.numel += numels[i];
        if cur.numel >= limit {
            buckets.push(std::mem::replace(&mut cur, empty()));
        }
    }
    if !cur.params.is_empty() {
        buckets.push(cur);
    }
    buckets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reverse_order_and_closing_rule() {
        // Params 0..5 of 4, 3, 5, 2, 6 elements, bucket size 7: reversed 4(6), 3(2) -> 8 >= 7
        // closes; 2(5), 1(3) -> 8 closes; 0(4) is the last, smaller bucket.
        let b = layout_buckets(&[4, 3, 5, 2, 6], Some(7));
        assert_eq!(b.iter().map(|b| b.params.clone()).collect::<Vec<_>>(), vec![vec![4, 3], vec![2, 1], vec![0]]);
        assert_eq!(b[0].offsets, vec![0, 6]);
        assert_eq!(b.iter().map(|b| b.numel).collect::<Vec<_>>(), vec![8, 8, 4]);
        let one = layout_buckets(&[4, 3, 5], None);
        assert_eq!(
            one,
            vec![Bucket { params: vec![2, 1, 0], offsets: vec![0, 5, 8], numel: 12, sizes: vec![5, 3, 4] }]
        );
        let sep = layout_buckets_separate(&[4, 3, 5], None, &[true, false, false]);
        assert_eq!(sep.iter().map(|b| b.params.clone()).collect::<Vec<_>>(), vec![vec![0], vec![2, 1]]);
        assert!(layout_buckets(&[], Some(3)).is_empty());
        // A parameter larger than the bucket size gets a bucket of its own.
        assert_eq!(layout_buckets(&[1, 10], Some(4)).len(), 2);
    }

    #[test]
    fn megatron_default_size() {
        assert_eq!(default_bucket_size(1), 40_000_000);
        assert_eq!(default_bucket_size(64), 64_000_000);
    }
}
