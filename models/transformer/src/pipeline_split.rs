//! Which global decoder layers each pipeline stage owns (SPEC §5.5): an even split, or
//! Megatron's uneven split with `--decoder-first-pipeline-num-layers` /
//! `--decoder-last-pipeline-num-layers` (the layers left are split evenly over the middle
//! stages). Layer numbers stay global, so parameter names and init seeds do not depend on
//! the split and a checkpoint reshards between splits and pp = 1.
//!
//! Rules (Megatron-Core `TransformerConfig.__post_init__` / `get_num_layers_to_build`): a
//! given first/last count must be > 0; the middle stages share the rest evenly, at least one
//! layer each; with no middle stage the counts must add up to `--num-layers`. Megatron never
//! builds a stage with 0 decoder layers through these flags, and neither do we. At pp = 1 the
//! one stage holds every layer whatever the counts say (the driver rejects the flags there).

use anyhow::{bail, Result};
use std::ops::Range;

/// Global layer ranges of all `pp` stages, in stage order; they tile `0..num_layers`.
pub fn pipeline_split(
    num_layers: usize,
    pp: usize,
    first: Option<usize>,
    last: Option<usize>,
) -> Result<Vec<Range<usize>>> {
    if pp == 0 {
        bail!("--pipeline-model-parallel-size must be >= 1");
    }
    if first.is_none() && last.is_none() {
        if !num_layers.is_multiple_of(pp) || num_layers < pp {
            bail!(
                "--num-layers {num_layers} must be a multiple of --pipeline-model-parallel-size {pp} (every stage \
                 gets the same number of layers, at least one); change one of them, or give \
                 --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers for an uneven split"
            );
        }
        let per = num_layers / pp;
        return Ok((0..pp).map(|s| s * per..(s + 1) * per).collect());
    }
    if pp == 1 {
        // One stage is first and last at once and holds every layer; the counts describe a
        // split that does not exist (e.g. a pp = 1 run loading an uneven checkpoint). The
        // driver rejects the flags at pp = 1, so a user never sets them here by accident.
        return Ok(std::iter::once(0..num_layers).collect());
    }
    for (flag, n) in [("first", first), ("last", last)] {
        if n == Some(0) {
            bail!("--decoder-{flag}-pipeline-num-layers must be larger than 0 (every stage needs a decoder layer)");
        }
    }
    let given = first.unwrap_or(0) + last.unwrap_or(0);
    let middle_stages = pp - usize::from(first.is_some()) - usize::from(last.is_some());
    let shown = |n: Option<usize>| n.map_or("unset".to_string(), |n| n.to_string());
    let flags = format!(
        "--decoder-first-pipeline-num-layers {} and --decoder-last-pipeline-num-layers {} with --num-layers \
         {num_layers} and --pipeline-model-parallel-size {pp}",
        shown(first),
        shown(last)
    );
    if given > num_layers {
        bail!("{flags}: the first/last stages would hold {given} layers, more than --num-layers; lower them");
    }
    let rest = num_layers - given;
    let per_middle = if middle_stages == 0 {
        if rest != 0 {
            bail!("{flags}: the stages hold {given} layers, not --num-layers {num_layers}; make them add up");
        }
        0
    } else {
        if !rest.is_multiple_of(middle_stages) || rest < middle_stages {
            bail!(
                "{flags}: the {rest} remaining layers must split evenly over the {middle_stages} other stage(s), at \
                 least one layer each; change the first/last counts or --num-layers"
            );
        }
        rest / middle_stages
    };
    let sizes = (0..pp).map(|s| match (s, first, last) {
        (0, Some(n), _) => n,
        (s, _, Some(n)) if s + 1 == pp => n,
        _ => per_middle,
    });
    let mut start = 0;
    Ok(sizes
        .map(|n| {
            start += n;
            start - n..start
        })
        .collect())
}

/// Global layer numbers of stage `stage` of `pp` with the even split (SPEC §5.5).
pub fn stage_layers(num_layers: usize, pp: usize, stage: usize) -> Result<Range<usize>> {
    stage_range(num_layers, pp, stage, None, None)
}

/// Global layer numbers of stage `stage` of `pp`, uneven when `first` / `last` are given.
pub fn stage_range(
    num_layers: usize,
    pp: usize,
    stage: usize,
    first: Option<usize>,
    last: Option<usize>,
) -> Result<Range<usize>> {
    let split = pipeline_split(num_layers, pp, first, last)?;
    match split.get(stage) {
        Some(r) => Ok(r.clone()),
        None => bail!("pipeline stage {stage} does not exist with --pipeline-model-parallel-size {pp}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_and_uneven_splits_tile_the_layers() {
        assert_eq!(pipeline_split(4, 2, None, None).unwrap(), vec![0..2, 2..4]);
        assert_eq!(pipeline_split(4, 2, Some(3), None).unwrap(), vec![0..3, 3..4]);
        assert_eq!(pipeline_split(4, 2, None, Some(3)).unwrap(), vec![0..1, 1..4]);
        assert_eq!(pipeline_split(4, 2, Some(1), Some(3)).unwrap(), vec![0..1, 1..4]);
        assert_eq!(pipeline_split(4, 3, Some(1), Some(1)).unwrap(), vec![0..1, 1..3, 3..4]);
        assert_eq!(pipeline_split(12, 4, Some(3), None).unwrap(), vec![0..3, 3..6, 6..9, 9..12]);
        assert_eq!(pipeline_split(12, 2, Some(8), None).unwrap(), vec![0..8, 8..12]);
        assert_eq!(stage_range(7, 3, 2, None, Some(1)).unwrap(), 6..7);
    }

    #[test]
    fn bad_splits_name_the_flags() {
        let err = |l, pp, f, la| pipeline_split(l, pp, f, la).unwrap_err().to_string();
        let e = err(4, 2, Some(4), None);
        assert!(e.contains("--decoder-first-pipeline-num-layers 4") && e.contains("1 other stage"), "{e}");
        let e = err(5, 4, Some(1), None);
        assert!(e.contains("4 remaining layers") && e.contains("3 other stage"), "{e}");
        let e = err(4, 2, Some(1), Some(2));
        assert!(e.contains("not --num-layers 4"), "{e}");
        let e = err(4, 2, Some(5), None);
        assert!(e.contains("more than --num-layers"), "{e}");
        let e = err(4, 2, None, Some(0));
        assert!(e.contains("--decoder-last-pipeline-num-layers must be larger than 0"), "{e}");
        assert_eq!(stage_range(4, 1, 0, Some(3), Some(1)).unwrap(), 0..4);
        let e = err(3, 2, None, None);
        assert!(e.contains("--num-layers 3") && e.contains("--pipeline-model-parallel-size 2"), "{e}");
    }
}
