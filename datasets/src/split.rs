//! The `--split` string (SPEC §2.2): parsing, normalisation and the element ranges of the
//! train/valid/test splits, with Megatron's exact float arithmetic and Python `round`.

use crate::pyjson::PyValue;
use anyhow::{anyhow, bail};
use megatron_core::Result;
use std::ops::Range;

/// Megatron's default when `--data-path` is given without `--split` (the legacy value, with
/// its spaces: the string is part of the dataset description and so of the cache file names).
pub const DEFAULT_SPLIT: &str = "969, 30, 1";

/// Split names in order.
pub const SPLIT_NAMES: [&str; 3] = ["train", "valid", "test"];

/// Parses `split` like `parse_and_normalize_split`: every `[.0-9]+` run is a number, padded
/// with zeros to three, non-negative, normalised to sum 1.
pub fn parse_split(split: &str) -> Result<[f64; 3]> {
    let mut numbers = vec![];
    let mut rest = split;
    while let Some(start) = rest.find(|c: char| c == '.' || c.is_ascii_digit()) {
        let tail = &rest[start..];
        let len = tail.find(|c: char| c != '.' && !c.is_ascii_digit()).unwrap_or(tail.len());
        let text = &tail[..len];
        let value: f64 =
            text.parse().map_err(|_| anyhow!("--split {split:?}: {text:?} is not a number; use e.g. \"969,30,1\""))?;
        numbers.push(value);
        rest = &tail[len..];
    }
    if numbers.len() > 3 {
        bail!("--split {split:?} has {} numbers; give at most three (train, valid, test)", numbers.len());
    }
    numbers.resize(3, 0.0);
    // Sequential sum, as numpy's sum of three elements.
    let total = numbers[0] + numbers[1] + numbers[2];
    if !(total > 0.0 && total.is_finite()) {
        bail!("--split {split:?}: the weights must be finite and sum to more than zero");
    }
    Ok([numbers[0] / total, numbers[1] / total, numbers[2] / total])
}

/// The `(start, end)` fractions of each split (`convert_split_vector_to_split_matrix`): the
/// bookends of the running sums `[0, a, a+b, a+b+c]` (so the last end is `a+b+c`, which may
/// differ from 1 in the last bit); a split of zero width is `None` (not built).
pub fn split_bookends(weights: [f64; 3]) -> [Option<(f64, f64)>; 3] {
    let [a, b, c] = weights;
    let ends = [0.0, a, a + b, a + b + c];
    [0, 1, 2].map(|k| if ends[k + 1] <= ends[k] { None } else { Some((ends[k], ends[k + 1])) })
}

/// The split matrix as Python holds it in the dataset description: `[[0, a], [a, a+b], ...]`
/// with the very first bound the integer `0`, `null` for an empty split.
pub fn split_matrix_value(bookends: &[Option<(f64, f64)>; 3]) -> PyValue {
    PyValue::List(
        bookends
            .iter()
            .enumerate()
            .map(|(k, b)| {
                PyValue::opt(*b, |(lo, hi)| {
                    let lo = if k == 0 { PyValue::Int(0) } else { PyValue::Float(lo) };
                    PyValue::List(vec![lo, PyValue::Float(hi)])
                })
            })
            .collect(),
    )
}

/// The element indices `[round(start*N), round(end*N))` of each split over `n` elements
/// (Python's `round`: ties to even).
pub fn split_ranges(split: &str, n: usize) -> Result<[Option<Range<usize>>; 3]> {
    let bookends = split_bookends(parse_split(split)?);
    let nf = n as f64;
    Ok(bookends.map(|b| {
        b.map(|(lo, hi)| {
            let begin = (lo * nf).round_ties_even() as usize;
            let end = (hi * nf).round_ties_even() as usize;
            begin..end.max(begin)
        })
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_split_of_1000_matches_the_spec() -> Result<()> {
        let r = split_ranges(DEFAULT_SPLIT, 1000)?;
        assert_eq!(r, [Some(0..969), Some(969..999), Some(999..1000)]);
        // With or without the legacy spaces, and decimals are accepted.
        assert_eq!(split_ranges("969,30,1", 1000)?, r);
        assert_eq!(parse_split("0.5,0.25,0.25")?, [0.5, 0.25, 0.25]);
        Ok(())
    }

    #[test]
    fn padding_zero_widths_and_bankers_rounding() -> Result<()> {
        assert_eq!(parse_split("98,2")?, [0.98, 0.02, 0.0]);
        assert_eq!(split_ranges("98,2", 100)?, [Some(0..98), Some(98..100), None]);
        assert_eq!(split_ranges("1,0,1", 10)?, [Some(0..5), None, Some(5..10)]);
        // 0.5 * 5 = 2.5 rounds to 2 (ties to even), 0.5 * 7 = 3.5 rounds to 4.
        assert_eq!(split_ranges("1,1", 5)?, [Some(0..2), Some(2..5), None]);
        assert_eq!(split_ranges("1,1", 7)?, [Some(0..4), Some(4..7), None]);
        // A split may be non-zero in weight but empty after rounding.
        assert_eq!(split_ranges("969,30,1", 10)?[2], Some(10..10));
        Ok(())
    }

    #[test]
    fn split_matrix_prints_as_python_holds_it() -> Result<()> {
        let m = split_bookends(parse_split(DEFAULT_SPLIT)?);
        let text = split_matrix_value(&m).dumps_indent4();
        let compact: String = text.split_whitespace().collect();
        assert_eq!(compact, "[[0,0.969],[0.969,0.999],[0.999,1.0]]");
        let m = split_bookends(parse_split("0,1")?);
        assert_eq!(
            split_matrix_value(&m).dumps_indent4().split_whitespace().collect::<String>(),
            "[null,[0.0,1.0],null]"
        );
        Ok(())
    }

    #[test]
    fn bad_split_strings_are_errors() {
        assert!(parse_split("0,0,0").is_err());
        assert!(parse_split("1,2,3,4").is_err());
        assert!(parse_split("1..2").is_err());
        assert!(parse_split("none").is_err());
    }
}
