//! Blend specifications (SPEC §2.1, §2.4): parsing `--data-path` style lists into prefixes and
//! optional weights (`get_blend_from_list`), numpy-exact weight normalisation, and the per-dataset
//! sample counts of a weighted blend with Megatron's surplus.

use anyhow::bail;
use megatron_core::Result;

/// Megatron's default `--mid-level-dataset-surplus`.
pub const DEFAULT_SURPLUS: f64 = 0.005;

/// Prefixes with optional (unnormalised) weights.
#[derive(Clone, Debug, PartialEq)]
pub struct Blend {
    pub prefixes: Vec<String>,
    /// `None`: weights are inferred from the component lengths.
    pub weights: Option<Vec<f64>>,
}

/// Python's `float(s)` for the forms a weight takes (`"0.3"`, `"30"`, `"1e-2"`, `"inf"`).
fn py_float(s: &str) -> Option<f64> {
    let t = s.trim();
    let body = t.trim_start_matches(['+', '-']).to_ascii_lowercase();
    let numeric = body.starts_with(|c: char| c.is_ascii_digit() || c == '.');
    // Rust also parses these spellings, as Python does.
    let special = matches!(body.as_str(), "inf" | "infinity" | "nan");
    if numeric || special {
        t.parse().ok()
    } else {
        None
    }
}

impl Blend {
    /// `get_blend_from_list`: the entries are split on whitespace first, so `["0.3 A 0.7 B"]`
    /// and `["0.3", "A", "0.7", "B"]` are the same. An odd count is all prefixes; an even count
    /// is weighted when every even position parses as a float, else all prefixes. `None` when
    /// the list is empty.
    pub fn parse(words: &[String]) -> Result<Option<Blend>> {
        let words: Vec<&str> = words.iter().flat_map(|w| w.split_whitespace()).collect();
        if words.is_empty() {
            return Ok(None);
        }
        let weights: Option<Vec<f64>> =
            if words.len().is_multiple_of(2) { words.chunks(2).map(|pair| py_float(pair[0])).collect() } else { None };
        let prefixes: Vec<String> = match &weights {
            Some(_) => words.chunks(2).map(|p| p[1].to_string()).collect(),
            None => words.iter().map(|w| w.to_string()).collect(),
        };
        if let Some(w) = &weights {
            if let Some(bad) = w.iter().find(|&&x| !(x > 0.0 && x.is_finite())) {
                bail!("blend weight {bad} must be a positive finite number (in `{}`)", words.join(" "));
            }
        }
        Ok(Some(Blend { prefixes, weights }))
    }
}

/// `numpy.sum` of a float64 array: pairwise summation with numpy's 8-way unrolled blocks.
pub fn numpy_sum(a: &[f64]) -> f64 {
    let n = a.len();
    if n < 8 {
        let mut res = 0.0;
        for &x in a {
            res += x;
        }
        res
    } else if n <= 128 {
        let mut r: [f64; 8] = [a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]];
        let mut i = 8;
        while i < n - n % 8 {
            for (j, rj) in r.iter_mut().enumerate() {
                *rj += a[i + j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        while i < n {
            res += a[i];
            i += 1;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        numpy_sum(&a[..n2]) + numpy_sum(&a[n2..])
    }
}

/// Megatron's `normalize`: `w / numpy.sum(w)`.
pub fn normalize(weights: &[f64]) -> Vec<f64> {
    let total = numpy_sum(weights);
    weights.iter().map(|w| w / total).collect()
}

/// `_get_size_per_split_per_dataset` for one split: `ceil(ceil(size * w_i) * (1 + surplus))`
/// samples of each component (`surplus = 0` gives the blend's target counts).
pub fn size_per_dataset(normalized_weights: &[f64], size: u64, surplus: f64) -> Vec<u64> {
    normalized_weights.iter().map(|w| ((size as f64 * w).ceil() * (1.0 + surplus)).ceil() as u64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        vec![s.to_string()]
    }

    #[test]
    fn parses_weighted_unweighted_and_single() -> Result<()> {
        let b = Blend::parse(&words("0.3 /d/A 0.7 /d/B"))?;
        assert_eq!(b, Some(Blend { prefixes: vec!["/d/A".into(), "/d/B".into()], weights: Some(vec![0.3, 0.7]) }));
        let b = Blend::parse(&["30".to_string(), "A".into(), "70".into(), "B".into()])?;
        assert_eq!(b.and_then(|b| b.weights), Some(vec![30.0, 70.0]));
        let b = Blend::parse(&words("A B"))?;
        assert_eq!(b, Some(Blend { prefixes: vec!["A".into(), "B".into()], weights: None }));
        let b = Blend::parse(&words("A"))?;
        assert_eq!(b.map(|b| b.prefixes), Some(vec!["A".to_string()]));
        // Even length but a non-number at an even position: all prefixes.
        assert_eq!(Blend::parse(&words("0.5 A B C"))?.and_then(|b| b.weights), None);
        assert_eq!(Blend::parse(&words("A 1 B 2"))?.map(|b| b.prefixes.len()), Some(4));
        assert_eq!(Blend::parse(&[])?, None);
        assert!(Blend::parse(&words("0 A 1 B")).is_err());
        assert!(Blend::parse(&words("-1 A 1 B")).is_err());
        Ok(())
    }

    #[test]
    fn numpy_sum_is_pairwise() {
        let a: Vec<f64> = (0..300).map(|i| 0.1 * i as f64 + 1e-3).collect();
        // numpy's blocking of 300 elements: 144 + 156, then 72 + 72 and 72 + 84.
        let block = |s: &[f64]| {
            let mut r = [0.0; 8];
            r.copy_from_slice(&s[..8]);
            let full = s.len() - s.len() % 8;
            for c in s[8..full].chunks(8) {
                for j in 0..8 {
                    r[j] += c[j];
                }
            }
            let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
            for &x in &s[full..] {
                res += x;
            }
            res
        };
        let want = (block(&a[..72]) + block(&a[72..144])) + (block(&a[144..216]) + block(&a[216..]));
        assert_eq!(numpy_sum(&a).to_bits(), want.to_bits());
        assert_eq!(numpy_sum(&[0.1, 0.2, 0.3]), 0.1 + 0.2 + 0.3);
    }

    /// `(numpy.array(w) / numpy.sum(w)).tolist()` printed by numpy 2.4.6: 23 weights take the
    /// 8-way unrolled path, whose rounding differs from a sequential sum.
    #[test]
    fn normalize_matches_numpy() {
        let mut w = vec![0.17, 0.05, 0.5, 0.28];
        w.extend((1..20).map(|i| 0.013 * i as f64));
        let got = normalize(&w);
        assert_eq!(got[..3], [0.04899135446685879, 0.01440922190201729, 0.1440922190201729]);
    }

    #[test]
    fn sizes_include_the_surplus() {
        let w = normalize(&[0.3, 0.7]);
        assert_eq!(size_per_dataset(&w, 1000, 0.0), [300, 700]);
        // ceil(300 * 1.005) = ceil(301.5) = 302; ceil(700 * 1.005) = ceil(703.5) = 704.
        assert_eq!(size_per_dataset(&w, 1000, DEFAULT_SURPLUS), [302, 704]);
        assert_eq!(size_per_dataset(&normalize(&[1.0, 1.0, 1.0]), 10, 0.0), [4, 4, 4]);
    }
}
